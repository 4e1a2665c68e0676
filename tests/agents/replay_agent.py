"""An agent whose one step's calls come from the environment, to test replay after a changed deploy.

``REPLAY_TOOL`` (``send_invoice`` | ``send_refund``) and ``REPLAY_AMOUNT`` pick the side-effecting call;
``REPLAY_PROMPT`` the LLM request. With ``REPLAY_HANG=1`` the step waits after its calls for the test's
SIGKILL, so the calls are journaled but no checkpoint covers them. Effects go to ``$REPLAY_LOG/effects``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio

from agentlife import NOT_DONE, AgentProcess, Done, LLMClient, ScriptedLLM, ScriptedTurn, StepContext, tool


def _record(line: str) -> None:
    with (Path(os.environ["REPLAY_LOG"]) / "effects").open("a") as f:
        f.write(line + "\n")


def _effects() -> list[str]:
    path = Path(os.environ["REPLAY_LOG"]) / "effects"
    return path.read_text().splitlines() if path.exists() else []


def _verifier(kind: str) -> Any:
    """Asks the (file) billing system whether ``kind`` was sent under this idempotency key."""

    async def verify(invocation_id: str) -> Any:
        done = [line for line in _effects() if line.startswith(f"{invocation_id} {kind} ")]
        return f"{kind} {done[-1].split()[-1]}" if done else NOT_DONE

    return verify


@tool(verify=_verifier("invoice"))
async def send_invoice(amount: int, invocation_id: str) -> str:
    _record(f"{invocation_id} invoice {amount}")
    return f"invoice {amount}"


@tool(verify=_verifier("refund"))
async def send_refund(amount: int, invocation_id: str) -> str:
    _record(f"{invocation_id} refund {amount}")
    return f"refund {amount}"


class ReplayAgent(AgentProcess):
    agent_id = "replay"

    def make_llm(self) -> LLMClient:
        return ScriptedLLM([ScriptedTurn.text("noted")] * 4)

    async def step(self, ctx: StepContext) -> Done | None:
        fn = send_refund if os.environ["REPLAY_TOOL"] == "send_refund" else send_invoice
        sent = await ctx.call_tool(fn, amount=int(os.environ["REPLAY_AMOUNT"]))
        prompt = os.environ.get("REPLAY_PROMPT", "hello")
        reply = await ctx.llm.complete(
            model="claude-test", max_tokens=50, messages=[{"role": "user", "content": prompt}]
        )
        Path(os.environ["REPLAY_LOG"], "calls_done").touch()
        if os.environ.get("REPLAY_HANG") == "1":
            await anyio.sleep(3600)
        return Done(result={"sent": sent, "reply": reply.text})


class RerunReplayAgent(ReplayAgent):
    replay_mismatch = "rerun"
