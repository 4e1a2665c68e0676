"""Agents for the end-to-end durability tests (``tests/e2e/test_durability.py``), driven by environment.

Everything a test needs to observe is written to ``DURABLE_DIR``: a marker file per event (``touch``) and
append-only logs written with ``fsync``, so a SIGKILL right after an effect cannot lose its record.

- ``DURABLE_STEPS`` (default 3): steps until `Done`; ``DURABLE_STEP_SECONDS`` (default 0.01): sleep per step.
- ``DURABLE_GATE_STEP``: in that step, touch ``gate-waiting-{attempt}`` and wait until the file
  ``gate-{attempt}`` exists (after the step's LLM call).
- ``DURABLE_LLM=1``: one LLM call per step through a local client reporting fixed usage.
- ``DURABLE_CRASH_STEP`` / ``DURABLE_CRASH_MESSAGE``: raise ``RuntimeError(message)`` in that step.
- ``DURABLE_DELIVER_PAUSE``: seconds `deliver` sleeps after ``deliver-entered`` and before the real effect.
- ``DURABLE_HOUSEKEEPING_PAUSE``: seconds `housekeeping` sleeps after ``housekeeping-entered``.
- ``DURABLE_HOUSEKEEPING_FAIL=1``: `housekeeping` raises after ``housekeeping-entered``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import orjson

from agentlife import AgentProcess, Done, LLMClient, LLMReply, StepContext, StreamTimeouts, Usage


def _dir() -> Path:
    return Path(os.environ["DURABLE_DIR"])


def _attempt() -> str:
    return os.environ.get("AGENTLIFE_ATTEMPT", "1")


def _touch(name: str) -> None:
    _dir().joinpath(name).touch()


def _append(name: str, line: str) -> None:
    """Append one line durably: the test counts these after SIGKILLs."""
    fd = os.open(_dir() / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class _FixedUsageLLM:
    """Answers at once with 100 input / 10 output tokens, so the job row's usage moves on every call."""

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        timeouts: StreamTimeouts | None = None,
        **params: Any,
    ) -> LLMReply:
        return LLMReply(text="ok", usage=Usage(input_tokens=100, output_tokens=10), model=model)

    async def aclose(self) -> None:
        pass


class DurableAgent(AgentProcess):
    """A job of ``DURABLE_STEPS`` steps whose every step, delivery and housekeeping leaves a trace."""

    agent_id = "durable-agent"
    delivery_channel = "e2e"

    def make_llm(self) -> LLMClient:
        return _FixedUsageLLM()

    async def step(self, ctx: StepContext) -> Done | None:
        attempt = _attempt()
        _append("steps", f"{attempt} {ctx.step}")
        footprint = ctx.footprint
        _dir().joinpath(f"footprint-{attempt}.json").write_bytes(
            orjson.dumps(
                {
                    "reduced": footprint.reduced,
                    "max_context_tokens": footprint.max_context_tokens,
                    "browser_enabled": footprint.browser_enabled,
                    "max_concurrent_tools": footprint.max_concurrent_tools,
                }
            )
        )
        if os.environ.get("DURABLE_LLM") == "1":
            await ctx.llm.complete(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
        if str(ctx.step) == os.environ.get("DURABLE_GATE_STEP"):
            _touch(f"gate-waiting-{attempt}")
            while not _dir().joinpath(f"gate-{attempt}").exists():
                await anyio.sleep(0.01)
        if str(ctx.step) == os.environ.get("DURABLE_CRASH_STEP"):
            raise RuntimeError(os.environ.get("DURABLE_CRASH_MESSAGE", "crash"))
        await anyio.sleep(float(os.environ.get("DURABLE_STEP_SECONDS", "0.01")))
        ctx.state.setdefault("done_steps", []).append(ctx.step)
        _touch(f"step-{attempt}-{ctx.step}-done")
        if ctx.step + 1 >= int(os.environ.get("DURABLE_STEPS", "3")):
            return Done(result={"steps": ctx.state["done_steps"], "by_attempt": int(attempt)})
        return None

    async def deliver(self, result: Any) -> None:
        _touch(f"deliver-entered-{_attempt()}")
        await anyio.sleep(float(os.environ.get("DURABLE_DELIVER_PAUSE", "0")))
        _append("deliveries", f"{_attempt()} {orjson.dumps(result).decode()}")

    async def housekeeping(self, result: Any) -> None:
        _touch(f"housekeeping-entered-{_attempt()}")
        await anyio.sleep(float(os.environ.get("DURABLE_HOUSEKEEPING_PAUSE", "0")))
        if os.environ.get("DURABLE_HOUSEKEEPING_FAIL") == "1":
            raise OSError("archive bucket unreachable")
        _append("housekeeping", _attempt())
