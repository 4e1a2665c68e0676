"""A job replays only its own journal, never that of another job of the same id in the same data directory.

Two stores sharing one ``AGENTLIFE_DATA_DIR`` (or a job id created again after its tombstone expired, or a
fork into an id another job used) meet session files of the same ``sessions/{job_id}``: a fresh job's
marker carries the row's incarnation, so the other job's step 0 is never replayed as this one's.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from agentlife import Client, Done, StepContext
from agentlife._journal._recovery import scan_for_resume
from agentlife.stores import JobStatus, store_from_url
from agentlife.testing import AgentHarness
from agents.rewind_agent import RewindAgent, record_effect

pytestmark = pytest.mark.anyio


def _effects(data: Path) -> list[str]:
    path = data / "effects"
    return path.read_text().splitlines() if path.exists() else []


async def _run(data: Path, url: str, job_id: str, label: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REWIND_LABEL", label)
    store = store_from_url(url)
    await store.open()
    try:
        await store.init_schema()
        if await store.get_job(job_id) is None:
            await store.create_job(job_id, "rewind", None)
    finally:
        await store.close()
    run = await AgentHarness(data, env={"AGENTLIFE_DATABASE_URL": url}).run(RewindAgent(), job_id=job_id)
    assert run.exit_code == 0


async def _result(url: str, job_id: str) -> list[str]:
    store = store_from_url(url)
    await store.open()
    try:
        row = await store.get_job(job_id)
    finally:
        await store.close()
    assert row is not None and row.status == JobStatus.COMPLETED, row
    return list(row.result["results"])


async def _incarnation(url: str, job_id: str) -> str | None:
    store = store_from_url(url)
    await store.open()
    try:
        row = await store.get_job(job_id)
    finally:
        await store.close()
    assert row is not None
    return row.incarnation


async def test_a_job_of_the_same_id_in_another_store_runs_its_own_effects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("REWIND_DIR", str(data))
    a, b = f"sqlite:///{tmp_path / 'A.db'}", f"sqlite:///{tmp_path / 'B.db'}"
    await _run(data, a, "same", "a", monkeypatch)
    await _run(data, b, "same", "b", monkeypatch)
    assert len({await _incarnation(a, "same"), await _incarnation(b, "same"), None}) == 3
    assert await _result(a, "same") == [f"a:{n}" for n in range(10)]
    assert await _result(b, "same") == [f"b:{n}" for n in range(10)]  # before: "a:0" replayed from A's file
    effects = _effects(data)
    assert [e for e in effects if e.endswith(" b")] == [f"same/{n}/0 b" for n in range(10)]


async def test_a_fork_into_an_id_with_a_leftover_journal_replays_none_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("REWIND_DIR", str(data))
    a, b = f"sqlite:///{tmp_path / 'A.db'}", f"sqlite:///{tmp_path / 'B.db'}"
    await _run(data, b, "fork", "old", monkeypatch)  # leaves sessions/fork/ behind
    monkeypatch.setenv("REWIND_FAIL_AT", "8")  # steps 4 to 8 in reach
    await _run(data, a, "src", "v1", monkeypatch)
    monkeypatch.delenv("REWIND_FAIL_AT")
    async with await Client.connect(a) as client:
        await client.rewind("src", 4, as_job_id="fork", reason="try v2", actor="bob@ops")
    await _run(data, a, "fork", "v2", monkeypatch)
    assert await _result(a, "fork") == [f"v1:{n}" for n in range(5)] + [f"v2:{n}" for n in range(5, 10)]
    assert [e for e in _effects(data) if e.endswith(" v2")] == [f"fork/{n}/0 v2" for n in range(5, 10)]


def _session(folder: Path, name: str, marker: dict[str, object]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        {"type": "SESSION_STARTED", "seq": 0},
        {"type": "CHECKPOINT_WRITTEN", "seq": 1, "step": -1, "checkpoint_id": None, **marker},
        {"type": "STEP_STARTED", "seq": 2, "step": 0},
    ]
    (folder / name).write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))


@pytest.mark.parametrize(
    ("marker", "incarnation", "found"),
    [
        ({"incarnation": "mine"}, "mine", True),
        ({"incarnation": "theirs"}, "mine", False),
        ({"incarnation": "theirs"}, None, False),  # a row from before the column: not another's either
        ({}, None, True),  # a journal and a row from before incarnations: resumed as before
        ({}, "mine", False),  # an older journal left under the id of a new job
    ],
)
def test_a_fresh_jobs_marker_matches_only_its_own_incarnation(
    tmp_path: Path, marker: dict[str, object], incarnation: str | None, found: bool
) -> None:
    folder = tmp_path / "sessions" / "job"
    _session(folder, "session_0001_1700000000000.jsonl", marker)
    scan = scan_for_resume(folder, None, checkpoint_step=-1, incarnation=incarnation)
    assert scan.found is found, scan.reason
    if not found:
        assert "another job of the same id" in scan.reason


def test_a_checkpoint_marker_is_found_whatever_the_incarnation(tmp_path: Path) -> None:
    folder = tmp_path / "sessions" / "job"
    _session(folder, "session_0001_1700000000000.jsonl", {"checkpoint_id": "0001-000000-abcd0123"})
    scan = scan_for_resume(folder, "0001-000000-abcd0123", checkpoint_step=-1, incarnation="mine")
    assert scan.found, scan.reason


class _DiesOnceInStep0(RewindAgent):
    """Step 0 makes its effect, then its first attempt dies (before any checkpoint)."""

    async def step(self, ctx: StepContext) -> Done | None:
        if ctx.step == 0:
            result = await ctx.call_tool(record_effect, step=0)
            died = Path(os.environ["REWIND_DIR"]) / "died"
            if not died.exists():
                died.touch()
                raise RuntimeError("the pod went away")
            return Done(result={"results": [result]})
        return None


async def test_a_fresh_job_that_died_in_step_0_still_replays_its_own_effect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("REWIND_DIR", str(data))
    url = f"sqlite:///{tmp_path / 'A.db'}"
    harness = AgentHarness(data, env={"AGENTLIFE_DATABASE_URL": url})
    monkeypatch.setenv("REWIND_LABEL", "v1")
    await harness.run(_DiesOnceInStep0(), job_id="once")
    monkeypatch.setenv("REWIND_LABEL", "v2")
    await harness.run(_DiesOnceInStep0(), job_id="once")
    assert await _result(url, "once") == ["v1:0"]  # replayed from its own journal, not run again
    assert _effects(data) == ["once/0/0 v1"]
