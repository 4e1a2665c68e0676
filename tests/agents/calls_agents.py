"""Agents for the real-process tests of progress-aware calls (tests/runtime/test_calls.py).

They take their knobs from the environment, write marker files into ``TEST_MARKER_DIR`` so the test knows
when to signal, and use the default ``make_llm()`` (the real `AnthropicLLM` when ``ANTHROPIC_API_KEY`` is
set, pointed at a `FakeAnthropicServer` through ``ANTHROPIC_BASE_URL``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from agentlife import AgentProcess, Done, StepContext, tool

MODEL = "claude-sonnet-agentlife-test"  # priced as a sonnet by the default price table


def _marker(name: str, text: str = "") -> None:
    directory = os.environ.get("TEST_MARKER_DIR")
    if directory:
        Path(directory, name).write_text(text)


class LLMStepsAgent(AgentProcess):
    """One LLM call per step, ``TEST_STEPS`` steps, then Done with every reply's text."""

    agent_id = "llm-steps"

    async def step(self, ctx: StepContext) -> Done | None:
        reply = await ctx.llm.complete(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": f"step {ctx.step}"}]
        )
        ctx.state.setdefault("replies", []).append(reply.text)
        _marker(f"step-{ctx.step}-done")
        if ctx.step + 1 >= int(os.environ.get("TEST_STEPS", "3")):
            return Done(result={"replies": ctx.state["replies"]})
        return None


@tool(side_effects=False)
def sleeping_sync_tool(seconds: float) -> str:
    """A sync tool that ignores cancellation: it runs on a worker thread and just sleeps."""
    _marker("tool-started")
    time.sleep(seconds)
    _marker("tool-finished")
    return "slept"


def _sigterm_from_another_thread() -> None:
    """Deliver SIGTERM to a thread other than the main one, as the kernel may when a pod is stopped."""

    def send() -> None:
        time.sleep(0.2)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    threading.Thread(target=send, daemon=True).start()


@tool(side_effects=False)
async def loop_blocking_tool(seconds: float) -> str:
    """An async tool that blocks the event loop itself (the worst kind of tool)."""
    _marker("tool-started")
    if os.environ.get("TEST_SIGTERM_FROM_THREAD") == "1":
        _sigterm_from_another_thread()
    time.sleep(seconds)  # deliberately blocking: nothing on the loop runs until this returns
    _marker("tool-finished")
    return "blocked"


class StubbornToolAgent(AgentProcess):
    """Step 0 calls a tool that ignores cancellation for ``TEST_TOOL_SECONDS``.

    ``TEST_TOOL=sync`` blocks a worker thread; ``TEST_TOOL=loop`` blocks the event loop.
    """

    agent_id = "stubborn-tool"

    async def step(self, ctx: StepContext) -> Done | None:
        seconds = float(os.environ.get("TEST_TOOL_SECONDS", "60"))
        fn = loop_blocking_tool if os.environ.get("TEST_TOOL") == "loop" else sleeping_sync_tool
        await ctx.call_tool(fn, seconds=seconds)
        return Done(result="finished")


class ModulesAgent(AgentProcess):
    """One LLM call through the default ``make_llm()``; writes which client modules the process loaded."""

    agent_id = "modules"

    async def step(self, ctx: StepContext) -> Done | None:
        import sys

        reply = await ctx.llm.complete(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}])
        loaded = sorted(name for name in ("anthropic", "httpx", "openai") if name in sys.modules)
        _marker("modules", " ".join(loaded))
        return Done(result={"text": reply.text})
