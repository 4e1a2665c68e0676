"""The lifecycle in-process, through the harness (scaled time: the 45 s step deadline lasts 0.45 s)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentlife import NOT_DONE, AgentProcess, Done, State, StepContext, tool
from agentlife.testing import AgentHarness, DrainAt

pytestmark = pytest.mark.anyio

EFFECTS: list[str] = []


@tool(side_effects=True)
async def side_effect(label: str, invocation_id: str) -> str:
    EFFECTS.append(invocation_id)
    return f"{label}@{invocation_id}"


@tool(side_effects=False)
async def slow_read(seconds: float) -> str:
    await anyio.sleep(seconds)
    return "read"


class Counter(AgentProcess):
    agent_id = "counter"

    def __init__(self, steps: int = 3, tool_seconds: float = 0.0, slow_step: int | None = None) -> None:
        self.steps = steps
        self.tool_seconds = tool_seconds
        self.slow_step = slow_step
        self.delivered: list[Any] = []
        self.housekept: list[Any] = []

    async def step(self, ctx: StepContext) -> Done | None:
        ctx.state["n"] = ctx.state.get("n", 0) + 1
        if self.tool_seconds and self.slow_step in (None, ctx.step):
            await ctx.call_tool(slow_read, seconds=self.tool_seconds)
        await ctx.call_tool(side_effect, label=f"s{ctx.step}")
        if ctx.step + 1 >= self.steps:
            return Done(result={"n": ctx.state["n"]})
        return None

    async def deliver(self, result: Any) -> None:
        self.delivered.append(result)

    async def housekeeping(self, result: Any) -> None:
        self.housekept.append(result)


@pytest.fixture(autouse=True)
def _clear_effects() -> None:
    EFFECTS.clear()


async def test_runs_to_completion_with_a_checkpoint_per_step(agent_harness: AgentHarness) -> None:
    agent = Counter(steps=3)
    run = await agent_harness.run(agent)
    assert run.exit_code == 0
    assert run.final_state is State.TERMINATED
    assert run.transitions == [
        (State.BOOTING, State.HYDRATING),
        (State.HYDRATING, State.READY),
        (State.READY, State.EXECUTING),
        (State.EXECUTING, State.DRAINING),
        (State.DRAINING, State.TERMINATED),
    ]
    assert run.job is not None and run.job.status == "COMPLETED" and run.job.result == {"n": 3}
    assert agent.delivered == [{"n": 3}] and agent.housekept == [{"n": 3}]
    assert EFFECTS == ["job-1/0/0", "job-1/1/0", "job-1/2/0"]
    types = run.journal_types()
    assert types.count("CHECKPOINT_WRITTEN") == 4  # resume marker + one per step
    assert types[0] == "SESSION_STARTED" and types[-1] == "SESSION_ENDED"
    assert run.journal[-1]["exit_code"] == 0
    lifecycle = [(e["from"], e["to"]) for e in run.journal if e["type"] == "LIFECYCLE"]
    assert lifecycle[-1] == ("DRAINING", "TERMINATED")


async def test_a_completed_job_is_not_run_again(agent_harness: AgentHarness) -> None:
    await agent_harness.run(Counter(steps=2))
    again = Counter(steps=2)
    run = await agent_harness.run(again)
    assert run.exit_code == 0
    assert again.delivered == [] and EFFECTS == ["job-1/0/0", "job-1/1/0"]


async def test_drain_between_steps_exits_143_with_a_fresh_checkpoint(agent_harness: AgentHarness) -> None:
    run = await agent_harness.run(Counter(steps=10), drain=DrainAt.between_steps(after_step=1))
    assert run.exit_code == 143
    assert run.checkpoint is not None and run.checkpoint.next_step == 2 and run.checkpoint.state == {"n": 2}
    assert run.job is not None and run.job.status == "RUNNING"
    assert "DRAIN_STARTED" in run.journal_types()
    assert [e for e, _ in run.events].count("step_started") == 2
    # Between steps, the drain is immediate: no deadline waited for. Measured from the drain's request, not
    # from the start: booting and two steps on a loaded machine are no part of it.
    assert run.drained_at is not None and run.duration - run.drained_at < 0.45

    resumed = Counter(steps=4)
    rerun = await agent_harness.run(resumed)
    assert rerun.exit_code == 0
    assert rerun.job is not None and rerun.job.result == {"n": 4}
    assert [f"job-1/{i}/0" for i in range(4)] == EFFECTS


async def test_drain_inside_a_tool_that_finishes_in_time(agent_harness: AgentHarness) -> None:
    # slow_read takes 0.1 s; the scaled step deadline is 0.45 s.
    run = await agent_harness.run(
        Counter(steps=5, tool_seconds=0.1), drain=DrainAt.during_tool("slow_read", step=2)
    )
    assert run.exit_code == 143
    assert run.checkpoint is not None and run.checkpoint.next_step == 3
    assert EFFECTS == ["job-1/0/1", "job-1/1/1", "job-1/2/1"]


async def test_drain_deadline_cancels_a_tool_that_outlives_it(agent_harness: AgentHarness) -> None:
    run = await agent_harness.run(
        Counter(steps=5, tool_seconds=30, slow_step=1), drain=DrainAt.during_tool("slow_read", step=1)
    )
    assert run.exit_code == 143
    assert (
        run.checkpoint is not None and run.checkpoint.next_step == 1
    )  # nothing saved for the cancelled step
    assert run.drained_at is not None
    assert 0.4 < run.duration - run.drained_at < 2.0  # about the 0.45 s deadline, plus cleanup
    assert EFFECTS == ["job-1/0/0"]


async def test_second_signal_during_drain_is_ignored(agent_harness: AgentHarness) -> None:
    run = await agent_harness.run(Counter(steps=5), drain=DrainAt.between_steps(after_step=0, twice=True))
    assert run.exit_code == 143
    assert run.journal_types().count("DRAIN_STARTED") == 1
    assert any("ignored" in m for m in run.log_messages())


@pytest.mark.parametrize(
    ("moment", "expected"),
    [
        (DrainAt.during_boot(), [(State.BOOTING, State.DRAINING), (State.DRAINING, State.TERMINATED)]),
        (
            DrainAt.during_hydration(),
            [
                (State.BOOTING, State.HYDRATING),
                (State.HYDRATING, State.DRAINING),
                (State.DRAINING, State.TERMINATED),
            ],
        ),
        (
            DrainAt.when_ready(),
            [
                (State.BOOTING, State.HYDRATING),
                (State.HYDRATING, State.READY),
                (State.READY, State.DRAINING),
                (State.DRAINING, State.TERMINATED),
            ],
        ),
    ],
)
async def test_drain_before_execution(
    agent_harness: AgentHarness, moment: DrainAt, expected: list[tuple[State, State]]
) -> None:
    run = await agent_harness.run(Counter(), drain=moment)
    assert run.exit_code == 143
    assert run.transitions == expected
    assert EFFECTS == []


class Crasher(AgentProcess):
    agent_id = "crasher"

    async def step(self, ctx: StepContext) -> Done | None:
        if ctx.step == 1:
            raise ValueError("bad thing with password=hunter22")
        return None


async def test_crash_exits_1_and_records_context_on_the_row(agent_harness: AgentHarness) -> None:
    run = await agent_harness.run(Crasher())
    assert run.exit_code == 1
    assert run.transitions[-1] == (State.EXECUTING, State.TERMINATED)
    assert run.job is not None and len(run.job.error) == 1
    crash = run.job.error[0]
    assert crash["error_class"] == "ValueError" and crash["step"] == 1 and crash["exit_code"] == 1
    assert "hunter22" not in str(crash) and "bad thing" in crash["message"]
    assert run.checkpoint is not None and run.checkpoint.next_step == 1


async def test_bad_job_id_is_refused_at_boot(agent_harness: AgentHarness, tmp_path: Path) -> None:
    run = await agent_harness.run(Counter(), job_id="../../etc")
    assert run.exit_code == 1
    assert run.transitions == [(State.BOOTING, State.TERMINATED)]
    assert any("is not allowed" in m for m in run.log_messages())
    assert not (agent_harness.data_dir / "sessions").exists() or not any(
        p.name == "etc" for p in (agent_harness.data_dir).rglob("*")
    )


def _flip_byte(db: Path, job_id: str, *, history_too: int = 0) -> None:
    conn = sqlite3.connect(db)
    try:
        (blob,) = conn.execute("SELECT checkpoint FROM job WHERE id = ?", (job_id,)).fetchone()
        conn.execute("UPDATE job SET checkpoint = ? WHERE id = ?", (_flipped(blob), job_id))
        rows = conn.execute(
            "SELECT checkpoint_id, checkpoint FROM checkpoint_history WHERE job_id = ? "
            "ORDER BY created_at DESC LIMIT ?",
            (job_id, history_too),
        ).fetchall()
        for checkpoint_id, data in rows:
            conn.execute(
                "UPDATE checkpoint_history SET checkpoint = ? WHERE checkpoint_id = ?",
                (_flipped(data), checkpoint_id),
            )
        conn.commit()
    finally:
        conn.close()


def _flipped(blob: bytes) -> bytes:
    data = bytearray(blob)
    data[len(data) // 2] ^= 0x01
    return bytes(data)


async def test_corrupt_checkpoint_falls_back_to_the_previous_one(agent_harness: AgentHarness) -> None:
    await agent_harness.run(Counter(steps=10), drain=DrainAt.between_steps(after_step=2))
    _flip_byte(agent_harness.data_dir / "agentlife.db", "job-1", history_too=1)
    run = await agent_harness.run(Counter(steps=4))
    assert run.exit_code == 0
    assert any("Checkpoint CRC mismatch for job job-1" in m for m in run.log_messages())
    # The newest copy was bad in both places: the previous checkpoint (after step 1) was used, and step 2's
    # side effect was replayed from the journal instead of running again.
    assert EFFECTS == ["job-1/0/0", "job-1/1/0", "job-1/2/0", "job-1/3/0"]
    assert run.job is not None and run.job.result == {"n": 4}


async def test_no_valid_checkpoint_exits_1(agent_harness: AgentHarness) -> None:
    await agent_harness.run(Counter(steps=10), drain=DrainAt.between_steps(after_step=0))
    _flip_byte(agent_harness.data_dir / "agentlife.db", "job-1", history_too=10)
    run = await agent_harness.run(Counter())
    assert run.exit_code == 1
    assert run.transitions[-1] == (State.HYDRATING, State.TERMINATED)
    assert any("Checkpoint CRC mismatch for job job-1" in m for m in run.log_messages())


async def test_stale_attempt_is_fenced_and_exits_1(agent_harness: AgentHarness) -> None:
    await agent_harness.run(Counter(steps=10), attempt=5, drain=DrainAt.between_steps(after_step=0))
    run = await agent_harness.run(Counter(), attempt=3)
    assert run.exit_code == 1
    assert run.job is not None and run.job.attempt == 5


class Verifying(AgentProcess):
    """The tool's effect lands, then the process stops before TOOL_COMPLETED (a drain cancel here)."""

    agent_id = "verifying"
    done: set[str] = set()

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.call_tool(effect_then_hang)
        return Done(result="ok")


async def _verify(invocation_id: str) -> Any:
    return "verified" if invocation_id in Verifying.done else NOT_DONE


@tool(verify=_verify)
async def effect_then_hang(invocation_id: str) -> str:
    if invocation_id not in Verifying.done:
        Verifying.done.add(invocation_id)
        await anyio.sleep(30)  # cancelled at the drain deadline: TOOL_STARTED without completion
    return "ran"


async def test_pending_call_goes_through_verify(agent_harness: AgentHarness) -> None:
    Verifying.done.clear()
    first = await agent_harness.run(Verifying(), drain=DrainAt.during_tool("effect_then_hang"))
    assert first.exit_code == 143
    second = await agent_harness.run(Verifying())
    assert second.exit_code == 0
    assert second.job is not None and second.job.result == "ok"
    completed = [e for e in second.journal if e["type"] == "TOOL_COMPLETED"]
    assert completed[-1]["result"] == "verified" and completed[-1].get("verified") is True


async def test_sigterm_after_the_final_step_still_delivers_and_exits_0(agent_harness: AgentHarness) -> None:
    # The signal lands between the Done step's checkpoint and delivery: the runtime is already DRAINING.
    agent = Counter(steps=2)
    run = await agent_harness.run(agent, drain=DrainAt.between_steps(after_step=1))
    assert run.exit_code == 0, run.log_messages()
    assert run.job is not None and run.job.status == "COMPLETED" and run.job.error == []
    assert agent.delivered == [{"n": 2}]
    assert agent.housekept == []  # housekeeping is skipped once a drain began
    assert run.transitions[-2:] == [(State.EXECUTING, State.DRAINING), (State.DRAINING, State.TERMINATED)]


class PausedByAnOperator(Counter):
    """Pauses its own job during step 1, as an operator's `job pause` would while the step runs."""

    def __init__(self, database_url: str, steps: int) -> None:
        super().__init__(steps=steps)
        self.database_url = database_url

    async def step(self, ctx: StepContext) -> Done | None:
        if ctx.step == 1:
            from agentlife.stores import store_from_url

            store = store_from_url(self.database_url)
            await store.open()
            try:
                paused = await store.pause(ctx.job.id, reason="look first", actor="ops@host")
                assert paused.status == "RUNNING"  # requested: this step is not cut
            finally:
                await store.close()
        return await super().step(ctx)


async def test_a_pause_requested_during_a_step_parks_the_job_after_it_and_resume_runs_the_rest(
    agent_harness: AgentHarness,
) -> None:
    url = agent_harness.database_url
    run = await agent_harness.run(PausedByAnOperator(url, steps=4))
    assert run.exit_code == 0 and run.job is not None and run.job.status == "PAUSED"
    assert EFFECTS == ["job-1/0/0", "job-1/1/0"]  # step 1 ran to its end, step 2 never started
    assert run.checkpoint is not None and run.checkpoint.next_step == 2
    assert "JOB_PAUSED" in run.journal_types()
    idle = Counter(steps=4)
    again = await agent_harness.run(idle)  # a `run` started for a paused job does nothing
    assert again.exit_code == 0 and again.job is not None and again.job.status == "PAUSED"
    assert EFFECTS == ["job-1/0/0", "job-1/1/0"] and idle.delivered == []
    from agentlife.stores import store_from_url

    store = store_from_url(url)
    await store.open()
    try:
        assert (await store.resume("job-1", actor="ops@host")).status == "PENDING"
    finally:
        await store.close()
    resumed = await agent_harness.run(Counter(steps=4))
    assert resumed.exit_code == 0 and resumed.job is not None and resumed.job.result == {"n": 4}
    assert [f"job-1/{i}/0" for i in range(4)] == EFFECTS  # no call ran twice
