"""Actions on many jobs (`agentlife._jobs._batch` through `agentlife.Client`), on SQLite and PostgreSQL.

The selection's filters and bounds, two batches at once over overlapping selections (each job acted on
once), a job that changed meanwhile skipped while the rest go on, and ages parsed strictly.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from test_store_contract import Backend

from agentlife import Client, ConfigError, JobNotFound
from agentlife._jobs._batch import SelectionTooLarge, parse_age
from agentlife.stores import CheckpointStore, JobStatus, TableNames

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", str(tmp_path / "agentlife.db"), TableNames())
    return Backend("postgresql", request.getfixturevalue("postgres_url"), TableNames())


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[CheckpointStore]:
    opened = backend.open_store()
    await opened.open()
    await opened.init_schema()
    yield opened
    await opened.close()


def _url(backend: Backend) -> str:
    return f"sqlite:///{backend.location}" if backend.kind == "sqlite" else backend.location


async def _dead(store: CheckpointStore, *ids: str, agent: str = "mailer") -> None:
    """Jobs ended DEAD_LETTER as a worker leaves them (claimed, then given up)."""
    for job_id in ids:
        await store.create_job(job_id, agent, None)
        await store.claim(job_id, 1)
        await store.set_status(
            job_id, 1, JobStatus.DEAD_LETTER, error={"exit_code": 1, "error_class": "Boom"}
        )


async def test_two_batches_over_overlapping_selections_act_on_each_job_once(
    store: CheckpointStore, backend: Backend
) -> None:
    ids = [f"j-{n:03d}" for n in range(60)]
    await _dead(store, *ids)
    first, second = await Client.connect(_url(backend)), await Client.connect(_url(backend))
    try:
        selected = await first.select("retry", status="DEAD_LETTER")
        assert sorted(selected) == ids
        reports = {}

        async def run(name: str, client: Client, job_ids: list[str]) -> None:
            reports[name] = await client.act_many("retry", job_ids, actor=name)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "a", first, selected)
            tg.start_soon(run, "b", second, list(reversed(selected[20:])))  # overlaps the last 40
    finally:
        await first.close()
        await second.close()
    a, b = reports["a"], reports["b"]
    assert not set(a.done) & set(b.done) and set(a.done) | set(b.done) == set(ids)
    assert len(a.skipped) + len(b.skipped) == 40
    assert all("cannot retry" in why and "it is PENDING" in why for _, why in a.skipped + b.skipped)
    for job_id in ids:
        row = await store.get_job(job_id)
        assert row is not None and row.status == "PENDING"
        markers = [e for e in row.error if e.get("event") == "retry"]
        assert len(markers) == 1 and markers[0]["actor"] in ("a", "b"), row.error
        assert markers[0]["actor"] == ("a" if job_id in a.done else "b")


async def test_a_selection_reads_only_what_its_filters_name_oldest_first(
    store: CheckpointStore, backend: Backend
) -> None:
    await _dead(store, "old-1", "old-2", "new-1")
    await _dead(store, "other-1", agent="reviewer")
    await store.create_job("pending-1", "mailer", None)
    await _age(backend, {"old-1": 10 * 86400, "old-2": 9 * 86400, "other-1": 30 * 86400})
    async with await Client.connect(_url(backend)) as client:
        assert await client.select("retry", agent_id="mailer", older_than="7d") == ["old-1", "old-2"]
        assert await client.select("retry", older_than=8 * 86400.0) == ["other-1", "old-1", "old-2"]
        assert await client.select("retry", ids=["new-1", "pending-1", "nope", "old-1"]) == ["old-1", "new-1"]
        assert await client.select("cancel", agent_id="mailer") == ["pending-1"]
        with pytest.raises(JobNotFound, match="no job matches the selection"):
            await client.select("retry", agent_id="mailer", older_than="60d")
        with pytest.raises(ConfigError, match="retry acts on FAILED, DEAD_LETTER jobs, not PENDING"):
            await client.select("retry", status="PENDING")
        with pytest.raises(SelectionTooLarge, match="more than 2 jobs"):
            await client.select("retry", limit=2)
        for bad_limit in (0, 100_001, True, 1.5):
            with pytest.raises(ConfigError, match="limit"):
                await client.select("retry", limit=bad_limit)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="the action must be one of"):
            await client.select("delete")
        report = await client.act_many("cancel", ["pending-1", "old-1", "nope"], reason="dup", actor="ops")
    assert report.done == ("pending-1",)
    assert [job for job, _ in report.skipped] == ["old-1", "nope"]
    assert report.summary().startswith("cancel: 1 done, 2 skipped (e.g. cannot cancel job old-1")
    row = await store.get_job("pending-1")
    assert row is not None and (row.error[-1]["message"], row.error[-1]["actor"]) == ("dup", "ops")


async def _age(backend: Backend, ages: dict[str, float]) -> None:
    """Set each row's ``updated_at`` that many seconds back."""
    import time

    now = time.time()
    if backend.kind == "sqlite":
        conn = sqlite3.connect(backend.location, isolation_level=None)
        try:
            for job_id, age in ages.items():
                conn.execute("UPDATE job SET updated_at = ? WHERE id = ?", (now - age, job_id))
        finally:
            conn.close()
        return
    import asyncpg

    conn = await asyncpg.connect(backend.location)
    try:
        for job_id, age in ages.items():
            await conn.execute(
                "UPDATE job SET updated_at = to_timestamp($1::float8) WHERE id = $2", now - age, job_id
            )
    finally:
        await conn.close()


@pytest.mark.parametrize("good", [("7d", 604800.0), ("12h", 43200.0), ("30m", 1800.0), ("45s", 45.0)])
def test_an_age_is_a_whole_number_and_a_unit(good: tuple[str, float]) -> None:
    assert parse_age(good[0]) == good[1]


@pytest.mark.parametrize(
    "bad", ["7", "d", "7 d", "-7d", "7.5d", "7D", "7days", "1e3d", "", "7d\n1h", "9" * 12 + "d"]
)
def test_an_age_that_is_not_one_is_a_one_line_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="is not an age") as caught:
        parse_age(bad)
    assert "\n" not in str(caught.value)


async def test_a_batch_resume_undoes_a_batch_pause_of_running_and_waiting_jobs(
    store: CheckpointStore, backend: Backend
) -> None:
    await store.create_job("run-1", "mailer", None)
    await store.claim("run-1", 1)  # RUNNING: a pause is requested on its row
    await store.create_job("run-2", "mailer", None)
    await store.claim("run-2", 1)  # RUNNING, never asked to pause: not the resume's
    await store.create_job("pend-1", "mailer", None)
    async with await Client.connect(_url(backend)) as client:
        paused = await client.act_many("pause", ["run-1", "pend-1"], actor="ops")
        assert sorted(paused.done) == ["pend-1", "run-1"]
        assert await store.pause_requested("run-1", 1)
        selected = await client.select("resume", agent_id="mailer")
        assert sorted(selected) == ["pend-1", "run-1"]  # run-2 never had a pause to withdraw
        resumed = await client.act_many("resume", selected, actor="ops")
    assert sorted(resumed.done) == ["pend-1", "run-1"] and not resumed.skipped
    assert not await store.pause_requested("run-1", 1)  # the request withdrawn, as `job resume ID` does
    row = await store.get_job("pend-1")
    assert row is not None and row.status == JobStatus.PENDING
