"""The agent `benchmarks/chaos.py` and `benchmarks/soak.py` run as real ``python -m agentlife run`` processes.

Every step makes one LLM call and one side-effecting tool call, and records what it did in ``ctx.state``,
so the job's final result lists which attempt ran each step. Everything that happens outside the process
is appended, with fsync, to files under ``CHAOS_DIR`` that the chaos run reads afterwards as evidence:

* ``effects``: one line per *real* execution of a side effect, ``<invocation_id> <attempt> <pid>``. The
  effect tools have a ``verify`` that looks in this file, as a real tool would ask the external system
  whether its idempotency key was already used; so an invocation id listed twice is a duplicated effect.
* ``llm``: one line per LLM call really made by the scripted client, ``<invocation_id> <attempt>``.
* ``deliveries``: one line per delivery really announced, ``<job_id> <attempt> <pid>``.

The chaos run steers one fault per process through the environment: ``CHAOS_FAULT`` (a kind below),
``CHAOS_STEP`` (at the how-manieth step *this process* runs, from 0) and ``CHAOS_SECONDS`` (how long).
Points the runner waits for to send a signal are logged as ``chaos:<point> rel=<n> step=<n>``.

Fault kinds handled here: ``slow_tool`` (a long side-effecting tool), ``slow_llm`` (a long stream),
``slow_delivery``, ``llm_stall`` (a stream that stops sending, once), ``hang_before`` / ``hang_after`` (the
effect tool hangs before / after doing its effect, once), ``sync_hang`` (a sync tool that ignores
cancellation, once), ``block`` (the event loop blocked by ``time.sleep``). ``CHAOS_LLM=anthropic`` uses the
default Anthropic adapter (``ANTHROPIC_BASE_URL`` points at the runner's ``FakeAnthropicServer``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from agentlife import (
    NOT_DONE,
    AgentProcess,
    Done,
    Job,
    LLMClient,
    LLMReply,
    StepContext,
    StreamTimeouts,
    tool,
)
from agentlife.testing import ScriptedLLM, ScriptedTurn

MODEL = "claude-haiku-4-5"
log = logging.getLogger("chaos")


class _Fault:
    """The fault this process was started with (read once from the environment)."""

    def __init__(self) -> None:
        self.kind = os.environ.get("CHAOS_FAULT", "")
        self.step = int(os.environ.get("CHAOS_STEP", "-1"))
        self.seconds = float(os.environ.get("CHAOS_SECONDS", "0"))
        self.fired: set[str] = set()

    def hits(self, kind: str, rel: int) -> bool:
        return self.kind == kind and self.step == rel

    def once(self, kind: str, rel: int) -> bool:
        """True the first time ``kind`` hits step ``rel``: a retry of the same call then goes through."""
        if not self.hits(kind, rel) or kind in self.fired:
            return False
        self.fired.add(kind)
        log.info(f"chaos:fault_hit kind={kind} rel={rel}")
        return True


FAULT = _Fault()
_REL = {"current": -1}  # the relative step of this process, for the tools


def _attempt() -> str:
    return os.environ.get("AGENTLIFE_ATTEMPT", "1")


def _append(name: str, line: str) -> None:
    """Append one line and fsync it: the external record survives a SIGKILL right after."""
    directory = os.environ.get("CHAOS_DIR")
    if not directory:
        return
    fd = os.open(Path(directory, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _recorded(name: str) -> set[str]:
    directory = os.environ.get("CHAOS_DIR")
    path = Path(directory, name) if directory else None
    if path is None or not path.exists():
        return set()
    return {line.split()[0] for line in path.read_text().splitlines() if line.strip()}


def point(name: str, rel: int, step: int, **extra: Any) -> None:
    """Log a point the chaos runner can wait for (one JSON line on stdout)."""
    tail = "".join(f" {k}={v}" for k, v in extra.items())
    log.info(f"chaos:{name} rel={rel} step={step}{tail}")


async def _verify(invocation_id: str) -> Any:
    # Like asking the external system whether this idempotency key was already used.
    return f"done:{invocation_id}" if invocation_id in _recorded("effects") else NOT_DONE


async def _effect(step: int, invocation_id: str) -> str:
    rel = _REL["current"]
    point("tool_started", rel, step, tool="effect")
    if FAULT.once("hang_before", rel):
        await anyio.sleep_forever()
    await anyio.sleep(0.005)
    _append("effects", f"{invocation_id} {_attempt()} {os.getpid()}")
    if FAULT.once("hang_after", rel):
        # The effect happened but the call never returns, like a response lost on the way back.
        await anyio.sleep_forever()
    return f"done:{invocation_id}"


async def _slow_effect(step: int, seconds: float, invocation_id: str) -> str:
    point("tool_started", _REL["current"], step, tool="slow")
    await anyio.sleep(seconds)
    _append("effects", f"{invocation_id} {_attempt()} {os.getpid()}")
    return f"done:{invocation_id}"


def _sync_probe(seconds: float) -> str:
    time.sleep(seconds)  # ignores cancellation: the runtime must abandon it, not wait for it
    return "probed"


effect = tool(name="chaos_effect", timeout=0.6, verify=_verify)(_effect)
slow_effect = tool(name="chaos_slow_effect", timeout=30.0, verify=_verify)(_slow_effect)
sync_probe = tool(name="chaos_sync_probe", timeout=0.4, side_effects=False)(_sync_probe)


class ChaosLLM:
    """A scripted stream per call, through the real stream guard; records every call it really makes."""

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        timeouts: StreamTimeouts | None = None,
        **params: Any,
    ) -> LLMReply:
        tag = str(messages[-1]["content"])
        rel = _REL["current"]
        _append("llm", f"{tag} {_attempt()}")
        turn = ScriptedTurn.text(f"answer to {tag}", chunks=3, delay=0.003)
        if FAULT.hits("slow_llm", rel):
            chunks = max(2, int(FAULT.seconds / 0.1))
            turn = ScriptedTurn.text(f"answer to {tag}", chunks=chunks, delay=FAULT.seconds / chunks)
        elif FAULT.once("llm_stall", rel):
            turn = ScriptedTurn.stall(after_chunks=int(FAULT.seconds) % 3)
        return await ScriptedLLM([turn]).complete(
            model=model, messages=messages, max_tokens=max_tokens, timeouts=timeouts, **params
        )

    async def aclose(self) -> None:
        pass


class ChaosAgent(AgentProcess):
    """Runs ``payload["steps"]`` steps; each one LLM call and one side effect, both recorded outside."""

    agent_id = "chaos"

    def __init__(self) -> None:
        self._rel = 0

    def make_llm(self) -> LLMClient:
        if os.environ.get("CHAOS_LLM") == "anthropic":
            return super().make_llm()
        return ChaosLLM()

    def memory_query(self, job: Job, checkpoint: Mapping[str, Any] | None) -> str | None:
        return f"chaos job {job.id}"

    def memories_to_store(self, result: Any, state: Mapping[str, Any]) -> list[str]:
        # Only with a Qdrant server configured: otherwise local mode would start importing qdrant-client.
        return ["a chaos job completed"] if os.environ.get("AGENTLIFE_QDRANT_URL") else []

    async def step(self, ctx: StepContext) -> Done | None:
        rel, self._rel = self._rel, self._rel + 1
        _REL["current"] = rel
        total = int((ctx.job.payload or {}).get("steps", 10))
        point("step_started", rel, ctx.step)
        if FAULT.hits("block", rel):
            FAULT.once("block", rel)
            point("block_started", rel, ctx.step)
            time.sleep(FAULT.seconds)  # blocks the event loop on purpose
        point("llm_started", rel, ctx.step)
        reply = await ctx.llm.complete(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": f"{ctx.job.id}/{ctx.step}"}]
        )
        result = await ctx.call_tool(effect, step=ctx.step)
        if FAULT.hits("slow_tool", rel):
            FAULT.once("slow_tool", rel)
            await ctx.call_tool(slow_effect, step=ctx.step, seconds=FAULT.seconds)
        if FAULT.once("sync_hang", rel):
            try:
                await ctx.call_tool(sync_probe, seconds=3.0)
            except TimeoutError:
                point("sync_probe_abandoned", rel, ctx.step)
        ctx.state.setdefault("steps", []).append([ctx.step, int(_attempt()), result, len(reply.text)])
        point("step_done", rel, ctx.step)
        if ctx.step + 1 >= total:
            return Done(result={"steps": ctx.state["steps"]})
        return None

    async def deliver(self, result: Any) -> None:
        point("delivering", self._rel, -1)
        seconds = FAULT.seconds if FAULT.kind == "slow_delivery" else 0.005
        if FAULT.kind == "slow_delivery":
            FAULT.fired.add("slow_delivery")
            log.info("chaos:fault_hit kind=slow_delivery rel=-1")
        await anyio.sleep(seconds)
        _append("deliveries", f"{os.environ.get('AGENTLIFE_JOB_ID')} {_attempt()} {os.getpid()}")


class SoakAgent(ChaosAgent):
    """A long-lived agent for the soak: many short steps, each with an LLM call and a side effect."""

    agent_id = "soak"

    async def step(self, ctx: StepContext) -> Done | None:
        outcome = await super().step(ctx)
        # Keep the state small: a soak must measure the runtime's growth, not the agent's own list.
        ctx.state["steps"] = ctx.state["steps"][-5:]
        ctx.state["count"] = ctx.state.get("count", 0) + 1
        pause = float(os.environ.get("SOAK_STEP_PAUSE", "0.02"))
        await anyio.sleep(pause)
        return outcome
