"""What a turn waits for: which checkpoint commits wait for the store's log flush, and which fsyncs."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from agentlife import NOT_DONE, AgentProcess, Done, StepContext, tool
from agentlife._runtime._lifecycle import Runtime
from agentlife.testing import AgentHarness

pytestmark = pytest.mark.anyio

EFFECTS: list[str] = []


async def _recorded(invocation_id: str) -> Any:
    return "sent" if invocation_id in EFFECTS else NOT_DONE


@tool(side_effects=True, verify=_recorded)
def send(invocation_id: str) -> str:
    """Send once."""
    EFFECTS.append(invocation_id)
    return "sent"


@tool(side_effects=True)
def charge(invocation_id: str) -> str:
    """Charge once; no verify."""
    EFFECTS.append(invocation_id)
    return "charged"


class ThreeSteps(AgentProcess):
    """Steps 0 and 1 each call a verified side-effecting tool, step 2 one without verify, then Done."""

    agent_id = "three-steps"

    async def step(self, ctx: StepContext) -> Done | None:
        if ctx.step < 2:
            await ctx.call_tool(send)
            return None
        await ctx.call_tool(charge)
        return Done(result={"effects": len(EFFECTS)})


async def test_a_continuing_steps_checkpoint_skips_the_flush_and_a_verified_result_its_fsync(
    tmp_path: Path,
) -> None:
    EFFECTS.clear()
    flushed: list[bool] = []
    fsyncs_at_step_end: list[int] = []

    def on_event(runtime: Runtime, event: str, info: dict[str, Any]) -> None:
        if event == "step_completed" and runtime.journal is not None:
            fsyncs_at_step_end.append(runtime.journal.fsync_count)
        if event != "ready" or runtime.store is None:
            return
        store: Any = runtime.store
        write = store.write_checkpoint

        async def write_checkpoint(*args: Any, **kwargs: Any) -> int:
            flushed.append(kwargs.get("flushed", True))
            return await write(*args, **kwargs)

        store.write_checkpoint = write_checkpoint

    run = await AgentHarness(tmp_path / "agentlife").run(ThreeSteps(), on_event=on_event)
    assert run.exit_code == 0 and run.job is not None and run.job.status == "COMPLETED"
    assert EFFECTS == ["job-1/0/0", "job-1/1/0", "job-1/2/0"]
    # The steps the job goes on from guard no effect with their checkpoint; the last step's does.
    assert flushed == [False, False, True]
    # Step 1: one fsync, its write-ahead start (which writes step 0's buffered result out before it);
    # step 2: the start and the result of the tool without verify, durable before the step goes on.
    assert [b - a for a, b in itertools.pairwise(fsyncs_at_step_end)] == [1, 2]
    completed = [e for e in run.journal if e["type"] == "TOOL_COMPLETED"]
    assert [e["result"] for e in completed] == ["sent", "sent", "charged"]
