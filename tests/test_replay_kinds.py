"""A resumed step that makes another kind of call where the journal recorded one is a replay mismatch.

A tool call at a number where the journal recorded a wait (or an LLM call, or the reverse) must never run
live as if nothing had been recorded there: the step changed, and its recorded effects no longer line up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from agentlife import ReplayMismatch, ScriptedLLM, StepContext, tool
from agentlife._journal._recovery import build_replay
from stepctx import step_contexts

WAIT = {"type": "WAIT_STARTED", "step": 0, "call": 0, "kind": "sleep", "digest": "w1", "until": 1.0}
TOOL = {
    "type": "TOOL_STARTED",
    "step": 0,
    "call": 0,
    "invocation_id": "job-s/0/0",
    "tool": "charge",
    "digest": "t1",
    "side_effects": True,
}
LLM = {
    "type": "LLM_COMPLETED",
    "step": 0,
    "call": 0,
    "digest": "l1",
    "response": {"text": "hi", "model": "m", "stop_reason": "end_turn"},
}

ran: list[str] = []


@tool(side_effects=True)
async def charge(amount: int) -> str:
    """Charge ``amount``: the effect that must not run on a changed replay."""
    ran.append(f"charge {amount}")
    return "charged"


async def _call(ctx: StepContext, kind: str) -> Any:
    if kind == "tool":
        return await ctx.call_tool(charge, amount=5)
    if kind == "wait":
        return await ctx.sleep(0)
    return await ctx.llm.complete(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=16)


@pytest.mark.parametrize(
    ("recorded", "now"),
    [(WAIT, "tool"), (LLM, "tool"), (TOOL, "wait"), (LLM, "wait"), (WAIT, "llm"), (TOOL, "llm")],
)
def test_another_kind_of_call_at_a_recorded_number_is_a_mismatch_and_runs_nothing(
    tmp_path: Path, recorded: dict[str, Any], now: str
) -> None:
    ran.clear()
    llm = ScriptedLLM(["live reply"])

    async def main() -> None:
        async with step_contexts(tmp_path) as make:
            ctx, _journal = await make(llm)
            ctx._env.replay = build_replay([recorded], 0)
            with pytest.raises(ReplayMismatch) as caught:
                await _call(ctx, now)
            assert "job-s/0/0" in str(caught.value)

    anyio.run(main)
    assert ran == []  # the tool never ran live
    assert llm.calls == 0  # nor the model
