"""``job rewind``: a job starts again from the checkpoint it had after step N, or a fork does.

In-process runs of a ten-step agent (`agents.rewind_agent`) on both stores: the steps after N run again
under the changed deploy, the effects before N are not repeated, what was recorded after N is never
replayed, and every refusal (a step out of reach, a bad id, a live worker, a race) changes nothing.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentlife import (
    AgentProcess,
    AttemptFenced,
    Client,
    ConfigError,
    Done,
    JobStateConflict,
    LLMClient,
    ScriptedLLM,
    StepContext,
    tool,
)
from agentlife._jobs._rewind import plan_rewind, rewind_job
from agentlife.stores import CheckpointStore, JobStatus, store_from_url
from agentlife.testing import AgentHarness
from agents.rewind_agent import RewindAgent, record_effect
from procs import cli_in_process

pytestmark = pytest.mark.anyio

JOB = "job-r"
SECRET = "sk-ant-api03-" + "Q" * 40


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'data' / 'agentlife.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def harness(tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch) -> AgentHarness:
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("REWIND_DIR", str(tmp_path / "data"))
    return AgentHarness(tmp_path / "data", env={"AGENTLIFE_DATABASE_URL": url})


@pytest.fixture
async def store(url: str) -> AsyncIterator[CheckpointStore]:
    opened = store_from_url(url)
    await opened.open()
    await opened.init_schema()
    yield opened
    await opened.close()


async def _failed_at_8(
    harness: AgentHarness, store: CheckpointStore, monkeypatch: pytest.MonkeyPatch, job_id: str = JOB
) -> None:
    """Deploy v1 runs steps 0-8 of the job, one effect each, and ends it FAILED after step 8."""
    await store.create_job(job_id, "rewind", None)
    monkeypatch.setenv("REWIND_LABEL", "v1")
    monkeypatch.setenv("REWIND_FAIL_AT", "8")
    run = await harness.run(RewindAgent(), job_id=job_id)
    assert run.exit_code == 0
    monkeypatch.delenv("REWIND_FAIL_AT")


def _effects(harness: AgentHarness) -> list[str]:
    path = harness.data_dir / "effects"
    return path.read_text().splitlines() if path.exists() else []


def _cli(url: str, *args: str) -> Any:
    return cli_in_process(
        "job", *args, "--database-url", url, env={**os.environ, "AGENTLIFE_DATABASE_URL": url}
    )


async def test_rewind_to_step_4_reruns_the_steps_after_it_and_repeats_no_effect_before(
    harness: AgentHarness, store: CheckpointStore, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _failed_at_8(harness, store, monkeypatch)
    before = await store.get_job(JOB)
    assert before is not None and before.status == JobStatus.FAILED

    refused = _cli(url, "rewind", JOB, "--to-step", "4", "--reason", f"bad prompt, key {SECRET}")
    assert refused.returncode == 2, refused.stderr
    listed = [line for line in refused.stdout.splitlines() if line.startswith("  step ")]
    assert [line.split()[3] for line in listed] == [f"{JOB}/{n}/0" for n in (5, 6, 7, 8)]
    assert all("record_effect" in line and "(completed)" in line for line in listed)
    assert "--yes" in refused.stderr
    assert await store.get_job(JOB) == before  # nothing changed

    done = _cli(url, "rewind", JOB, "--to-step", "4", "--yes", "--actor", "alice@ops", "--reason", SECRET)
    assert done.returncode == 0, done.stderr
    assert f"job {JOB} rewound to step 4: PENDING" in done.stdout
    assert SECRET not in done.stdout + done.stderr
    row = await store.get_job(JOB)
    assert row is not None and row.status == JobStatus.PENDING and row.attempt == before.attempt + 1
    entry = row.error[-1]
    assert (entry["actor"], entry["to_step"], entry["event"]) == ("alice@ops", 4, "rewound")

    monkeypatch.setenv("REWIND_LABEL", "v2")  # the changed deploy
    run = await harness.run(RewindAgent(), job_id=JOB)
    assert run.exit_code == 0
    final = await store.get_job(JOB)
    assert final is not None and final.status == JobStatus.COMPLETED
    assert final.result["results"] == [f"v1:{n}" for n in range(5)] + [f"v2:{n}" for n in range(5, 10)]
    assert final.result["seen"] == list(range(10))  # the conversation as it was after step 4, then grown
    effects = _effects(harness)
    assert effects.count(f"{JOB}/4/0 v1") == 1 and not any(f"{JOB}/{n}/0 v2" in effects for n in range(5))
    assert [e for e in effects if e.endswith(" v2")] == [f"{JOB}/{n}/0 v2" for n in range(5, 10)]
    rewound = [e for e in run.journal if e["type"] == "REWOUND"]
    assert len(rewound) == 1 and (rewound[0]["to_step"], rewound[0]["actor"]) == (4, "alice@ops")
    assert SECRET not in str(run.journal) and SECRET not in str(final.error)


async def test_a_fork_runs_from_step_4_and_leaves_the_original_untouched(
    harness: AgentHarness, store: CheckpointStore, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _failed_at_8(harness, store, monkeypatch)
    original = await store.get_job(JOB)
    async with await Client.connect(url) as client:
        forked = await client.rewind(JOB, 4, as_job_id="job-fork", reason="try v2", actor="bob@ops")
        assert (forked.job_id, forked.status) == ("job-fork", "PENDING")
        with pytest.raises(JobStateConflict, match="already exists"):
            await client.rewind(JOB, 4, as_job_id="job-fork")
        for bad in ("../etc", "", "a" * 200, JOB):
            with pytest.raises(ConfigError):
                await client.rewind(JOB, 4, as_job_id=bad)
    assert await store.get_job(JOB) == original
    monkeypatch.setenv("REWIND_LABEL", "v2")
    await harness.run(RewindAgent(), job_id="job-fork")
    fork = await store.get_job("job-fork")
    assert fork is not None and fork.status == JobStatus.COMPLETED
    assert fork.result["results"] == [f"v1:{n}" for n in range(5)] + [f"v2:{n}" for n in range(5, 10)]
    assert fork.result["seen"] == list(range(10))
    assert not any(e.startswith("job-fork/") and int(e.split("/")[1]) < 5 for e in _effects(harness))
    assert await store.get_job(JOB) == original


async def test_a_step_out_of_reach_is_one_line_naming_the_reach_and_changes_nothing(
    harness: AgentHarness, store: CheckpointStore, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _failed_at_8(harness, store, monkeypatch)
    before = await store.get_job(JOB)
    for step in ("3", "9", "-1", "4.0", "1e3", "x", "", str(2**63), " 4 5", "\u0664"):
        out = _cli(url, "rewind", JOB, f"--to-step={step}", "--yes")
        assert out.returncode == 2, step
        message = out.stderr.strip()
        assert message.count("\n") == 0 and "Traceback" not in message
        if step in ("3", "9"):
            assert "steps 4 to 8" in message and "last 5 checkpoints" in message
        else:
            assert "--to-step must be a step number" in message
    missing = _cli(url, "rewind", "no-such-job", "--to-step", "4", "--yes")
    assert missing.returncode == 3 and "does not exist" in missing.stderr
    bad_id = _cli(url, "rewind", "../etc", "--to-step", "4", "--yes")
    assert bad_id.returncode == 2
    assert await store.get_job(JOB) == before


async def test_a_live_worker_is_refused_without_force_and_fenced_with_it(
    harness: AgentHarness, store: CheckpointStore, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _failed_at_8(harness, store, monkeypatch)
    await store.retry(JOB)
    claimed = await store.claim_next("rewind")  # a worker holds it now, heartbeat fresh
    assert claimed is not None
    held = claimed.attempt
    refused = _cli(url, "rewind", JOB, "--to-step", "5", "--yes")
    assert refused.returncode == 4 and "--force" in refused.stderr
    row = await store.get_job(JOB)
    assert row is not None and (row.status, row.attempt) == (JobStatus.RUNNING, held)

    forced = _cli(url, "rewind", JOB, "--to-step", "5", "--yes", "--force")
    assert forced.returncode == 0, forced.stderr
    row = await store.get_job(JOB)
    assert row is not None and (row.status, row.attempt) == (JobStatus.PENDING, held + 1)
    assert row.error[-1].get("fenced") is True
    with pytest.raises(AttemptFenced):  # the old worker's next write fails: it stops
        await store.write_checkpoint(JOB, held, "stale", 6, b"{}")


async def test_two_operators_and_a_worker_racing_one_wins_the_others_conflict(
    harness: AgentHarness, store: CheckpointStore, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _failed_at_8(harness, store, monkeypatch)
    other = store_from_url(url)  # the second operator's own connection
    await other.open()
    plans = [(store, await plan_rewind(store, JOB, 4)), (other, await plan_rewind(other, JOB, 6))]
    outcomes: list[str] = []

    async def rewind(operator: CheckpointStore, plan: Any) -> None:
        try:
            await rewind_job(operator, plan, actor="op")
            outcomes.append("won")
        except JobStateConflict as exc:
            outcomes.append(str(exc))

    try:
        async with anyio.create_task_group() as tasks:
            for operator, plan in plans:
                tasks.start_soon(rewind, operator, plan)
    finally:
        await other.close()
    assert outcomes.count("won") == 1
    assert "another operator or a worker acted first" in next(o for o in outcomes if o != "won")

    late = await plan_rewind(store, JOB, 4)  # planned, then a worker claims the job first
    assert await store.claim_next("rewind") is not None
    row = await store.get_job(JOB)
    with pytest.raises(JobStateConflict, match="acted first"):
        await rewind_job(store, late, actor="op")
    assert await store.get_job(JOB) == row


async def test_replay_never_returns_a_result_recorded_after_the_step(
    harness: AgentHarness, store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _failed_at_8(harness, store, monkeypatch)
    await rewind_job(store, await plan_rewind(store, JOB, 4), actor="op")
    assert all(r.step <= 4 for r in await store.step_records(JOB))
    loaded = await store.load_checkpoint(JOB)
    assert loaded is not None and loaded.checkpoint_id.startswith("rewind-000004-")
    kept = await store.kept_checkpoints(JOB)
    assert max(k.step for k in kept) == 4 and kept[0].checkpoint_id == loaded.checkpoint_id
    assert len(await store.load_conversation(JOB, 100)) == 5


def test_the_recovery_scan_passes_over_events_before_a_rewound_line_of_later_steps(tmp_path: Path) -> None:
    import orjson

    from agentlife._journal._recovery import build_replay, scan_for_resume

    def line(seq: int, type_: str, **fields: Any) -> bytes:
        return orjson.dumps({"v": 1, "ts": 1.0, "seq": seq, "type": type_, **fields}) + b"\n"

    step5 = [
        line(1, "TOOL_STARTED", step=5, call=0, invocation_id="j/5/0", tool="t", side_effects=True),
        line(2, "TOOL_COMPLETED", step=5, call=0, invocation_id="j/5/0", tool="t", result="old"),
    ]
    marker = line(0, "CHECKPOINT_WRITTEN", step=4, checkpoint_id="c4", crc=1)
    rewound = line(3, "REWOUND", to_step=4, checkpoint_id="c4", actor="op", reason="")
    later = line(4, "STEP_STARTED", step=4)
    for name, lines, replayed in (
        ("plain", [marker, *step5], 1),
        ("rewound", [marker, *step5, rewound, later], 0),
    ):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "session_0001_1000.jsonl").write_bytes(b"".join(lines))
        scan = scan_for_resume(folder, "c4", checkpoint_step=4)
        assert scan.found
        assert len(build_replay(scan.events, 5).tools) == replayed
        assert [e["type"] for e in scan.events if e.get("step") == 4] == (
            ["STEP_STARTED"] if replayed == 0 else []
        )


DEPLOYS: list[str] = []


@tool(side_effects=True, restricted=True)
async def deploy(target: str, invocation_id: str) -> str:
    DEPLOYS.append(invocation_id)
    return f"deployed {target}"


class Deployer(AgentProcess):
    """Step 0 records an effect, step 1 calls the restricted ``deploy``, then the job ends."""

    agent_id = "rewind-deployer"

    def make_llm(self) -> LLMClient:
        return ScriptedLLM([])

    async def step(self, ctx: StepContext) -> Done | None:
        if ctx.step == 0:
            await ctx.call_tool(record_effect, step=0)
            return None
        return Done(result=await ctx.call_tool(deploy, target="prod"))


async def test_a_rewind_carries_no_approval_over_the_call_asks_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REWIND_DIR", str(tmp_path))
    DEPLOYS.clear()
    # Idle timeout 30 s -> 0.3 s, approval poll 5 s -> 0.05 s.
    parking = {"AGENTLIFE_IDLE_TIMEOUT_SECONDS": "30", "AGENTLIFE_APPROVAL_POLL_SECONDS": "5"}
    harness = AgentHarness(tmp_path, env=parking)
    parked = await harness.run(Deployer(), job_id="dep")
    assert parked.job is not None and parked.job.status == "WAITING_FOR_APPROVAL"
    async with await Client.connect(harness.database_url) as client:
        await client.approve("dep")
        done = await harness.run(Deployer(), job_id="dep")
        assert done.job is not None and done.job.status == "COMPLETED" and DEPLOYS == ["dep/1/0"]
        await client.rewind("dep", 0, reason="deploy again?")
    again = await harness.run(Deployer(), job_id="dep")
    assert again.job is not None and again.job.status == "WAITING_FOR_APPROVAL"  # asks, does not deploy
    assert DEPLOYS == ["dep/1/0"]
    assert (tmp_path / "effects").read_text().splitlines() == ["dep/0/0 v1"]


async def test_a_history_entry_written_by_hand_is_a_one_line_error_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3
    import zlib

    monkeypatch.setenv("REWIND_DIR", str(tmp_path))
    harness = AgentHarness(tmp_path)
    monkeypatch.setenv("REWIND_FAIL_AT", "8")
    await harness.run(RewindAgent(), job_id=JOB)
    db = tmp_path / "agentlife.db"
    conn = sqlite3.connect(db)
    with conn:  # step 5's entry: bytes whose CRC matches, but no checkpoint; step 6's: a text step
        conn.execute(
            "UPDATE checkpoint_history SET checkpoint = ?, crc = ? WHERE job_id = ? AND step = 5",
            (b"[1, 2]", zlib.crc32(b"[1, 2]"), JOB),
        )
        conn.execute("UPDATE checkpoint_history SET step = 'six' WHERE job_id = ? AND step = 6", (JOB,))
    conn.close()
    url = harness.database_url
    store = store_from_url(url)
    await store.open()
    try:
        before = await store.get_job(JOB)
        bad = _cli(url, "rewind", JOB, "--to-step", "5", "--yes")
        assert bad.returncode == 2 and "not readable" in bad.stderr and bad.stderr.count("\n") == 1
        gone = _cli(url, "rewind", JOB, "--to-step", "6", "--yes")
        assert gone.returncode == 2 and "steps 4, 5, 7, 8" in gone.stderr
        assert await store.get_job(JOB) == before
        assert _cli(url, "rewind", JOB, "--to-step", "7", "--yes").returncode == 0
    finally:
        await store.close()


async def test_rewinding_a_paused_job_ends_its_pause(
    harness: AgentHarness, store: CheckpointStore, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _failed_at_8(harness, store, monkeypatch)
    async with await Client.connect(url) as client:
        await client.retry(JOB)
        paused = await client.pause(JOB, "look at step 7 first")
        assert paused.status == "PAUSED"
        rewound = await client.rewind(JOB, 4, actor="alice@ops")
        assert rewound.status == "PENDING"
        snapshot = await client.get(JOB)
        assert snapshot.status == "PENDING" and snapshot.paused is None  # no stale pause left on the row
        with pytest.raises(JobStateConflict):
            await client.resume(JOB)
