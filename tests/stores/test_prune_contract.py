"""Retention (`OperatorStore.prune_jobs`): finished jobs go with every row keyed by them, nothing else does.

Run unchanged against SQLiteStore and a real PostgreSQL. After each prune a query per table looks for a row
whose job is gone (an orphan) and for the rows of the jobs that must stay.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_job_ops_contract import _set
from test_store_contract import Backend, StoreFactory

from agentlife import ConfigError, JobNotFound, JobStateConflict
from agentlife._exceptions import ChildJobError
from agentlife.stores import CheckpointStore, JobStatus, TableNames
from agentlife.stores._prune import job_tables
from agentlife.stores._rewind import RewindTarget
from agentlife.stores._steprecords import StepRecord

pytestmark = pytest.mark.anyio

FINISHED = ["COMPLETED", "FAILED", "DEAD_LETTER"]
HOUR = 3600.0


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", str(tmp_path / "agentlife.db"), TableNames())
    return Backend("postgresql", request.getfixturevalue("postgres_url"), TableNames())


@pytest.fixture
async def make_store(backend: Backend) -> AsyncIterator[StoreFactory]:
    opened: list[CheckpointStore] = []

    async def make() -> CheckpointStore:
        store = backend.open_store()
        await store.open()
        opened.append(store)
        await store.init_schema()
        return store

    yield make
    for store in reversed(opened):
        await store.close()


@pytest.fixture
async def store(make_store: StoreFactory) -> CheckpointStore:
    return await make_store()


def _tables(backend: Backend) -> tuple[str, ...]:
    return job_tables(backend.tables, delta=backend.kind == "sqlite")


async def _job_with_rows(store: CheckpointStore, job_id: str, *, end: str | None, agent: str = "a") -> None:
    """A job with a row in every table keyed by a job; ``end``: its final status (None: left RUNNING)."""
    await store.create_job(job_id, agent, {"n": job_id})
    await store.claim(job_id, 1)
    records = [StepRecord(1, 1, 1, 0, b'{"event": "x"}')]
    await store.write_checkpoint(job_id, 1, f"{job_id}-c1", 1, b"state", [(0, b"m0")], records=records)
    await store.send_event(job_id, "ping", {"x": 1})
    await store.publish_output(job_id, 1, f"{job_id}-inv", "progress", b'"half"')
    await store.send_deltas(job_id, ["delta"])
    await store.record_delivery(f"{job_id}-delivery", job_id, "email")
    if end is not None:
        await store.set_status(job_id, 1, end, result={"ok": True})


async def _rows_of(backend: Backend, job_id: str) -> dict[str, int]:
    counts = {}
    for table in _tables(backend):
        ((n,),) = await backend.raw(f"SELECT count(*) FROM {table} WHERE job_id = $1", job_id)
        counts[table] = n
    return counts


async def _orphans(backend: Backend) -> dict[str, int]:
    """Per table, the rows whose job row is gone."""
    found = {}
    for table in _tables(backend):
        ((n,),) = await backend.raw(
            f"SELECT count(*) FROM {table} WHERE job_id NOT IN (SELECT id FROM {backend.tables.job})"
        )
        found[table] = n
    return found


async def _age(backend: Backend, *ids: str, hours: float = 2.0) -> None:
    for job_id in ids:
        await _set(backend, job_id, updated_at=time.time() - hours * HOUR)


async def test_a_prune_deletes_every_row_of_finished_jobs_and_none_of_live_ones(
    store: CheckpointStore, backend: Backend
) -> None:
    await _job_with_rows(store, "done", end="COMPLETED")
    await _job_with_rows(store, "failed", end="FAILED")
    await _job_with_rows(store, "live", end=None)
    await store.create_job("pending", "a", {})
    await _age(backend, "done", "failed", "live", "pending")
    before_live = await _rows_of(backend, "live")
    assert all(before_live.values()), before_live  # every table holds a row of the job: the test sees each
    assert all((await _rows_of(backend, "done")).values())

    result = await store.prune_jobs(older_than=HOUR, statuses=FINISHED, batch_size=1)

    assert sorted(result.job_ids) == ["done", "failed"] and result.count == 2
    assert await _orphans(backend) == dict.fromkeys(_tables(backend), 0)
    assert await _rows_of(backend, "done") == dict.fromkeys(_tables(backend), 0)
    assert await _rows_of(backend, "live") == before_live
    assert {j.id for j in await store.list_jobs()} == {"live", "pending"}
    tomb = await store.pruned_job("done")
    assert tomb is not None and (tomb.agent_id, tomb.status) == ("a", "COMPLETED")
    assert tomb.pruned_at >= tomb.finished_at
    assert await store.pruned_job("live") is None


async def test_only_jobs_older_than_the_cutoff_and_of_the_asked_status_and_agent_go(
    store: CheckpointStore, backend: Backend
) -> None:
    for job_id, agent, end in (
        ("old-a", "a", "COMPLETED"),
        ("old-b", "b", "COMPLETED"),
        ("dead", "a", "DEAD_LETTER"),
    ):
        await _job_with_rows(store, job_id, end=end, agent=agent)
    await _job_with_rows(store, "young", end="COMPLETED")
    await _age(backend, "old-a", "old-b", "dead")

    gone = await store.prune_jobs(older_than=HOUR, statuses=["COMPLETED"], agent_id="a")
    assert gone.job_ids == ("old-a",)
    gone = await store.prune_jobs(older_than=HOUR, statuses=FINISHED)
    assert sorted(gone.job_ids) == ["dead", "old-b"]
    assert await store.get_job("young") is not None


async def test_a_parent_whose_child_still_runs_is_kept(store: CheckpointStore, backend: Backend) -> None:
    await store.create_job("parent", "a", {})
    await store.claim("parent", 1)
    await store.start_child("parent", 1, "child", "a", {}, invocation_id="inv-1", detached=True)
    await store.set_status("parent", 1, "COMPLETED")
    await _age(backend, "parent")

    assert (await store.prune_jobs(older_than=HOUR, statuses=FINISHED)).count == 0
    assert await store.get_job("parent") is not None

    await store.claim("child", 1)
    await store.set_status("child", 1, "COMPLETED")
    gone = await store.prune_jobs(older_than=HOUR, statuses=FINISHED)
    assert gone.job_ids == ("parent",)  # the child just finished: young, it stays for its own age


async def test_a_dry_run_counts_and_lists_and_changes_nothing(
    store: CheckpointStore, backend: Backend
) -> None:
    for n in range(3):
        await _job_with_rows(store, f"d{n}", end="COMPLETED")
    await _age(backend, "d0", "d1", "d2")
    before = [await _rows_of(backend, f"d{n}") for n in range(3)]

    dry = await store.prune_jobs(older_than=HOUR, statuses=FINISHED, dry_run=True)

    assert dry.count == 3 and sorted(dry.job_ids) == ["d0", "d1", "d2"]
    assert [await _rows_of(backend, f"d{n}") for n in range(3)] == before
    assert all([await store.get_job(f"d{n}") for n in range(3)])
    assert await store.pruned_job("d0") is None


async def test_a_pruned_id_says_pruned_and_cannot_be_created_again(
    store: CheckpointStore, backend: Backend
) -> None:
    from agentlife import Client

    await _job_with_rows(store, "gone", end="COMPLETED")
    await _age(backend, "gone")
    await store.prune_jobs(older_than=HOUR, statuses=FINISHED)

    # A client retrying its create after the prune must not run the job a second time.
    with pytest.raises(JobStateConflict, match=r"job gone was pruned at .*COMPLETED, agent a"):
        await store.create_job("gone", "a", {})
    assert await store.get_job("gone") is None
    url = backend.location if backend.kind == "postgresql" else f"sqlite:///{backend.location}"
    async with await Client.connect(url) as client:
        with pytest.raises(JobNotFound, match=r"job gone was pruned at \d{4}-\d\d-\d\dT"):
            await client.get("gone")
        with pytest.raises(JobNotFound, match="job never does not exist"):
            await client.get("never")


async def _pruned(store: CheckpointStore, backend: Backend, job_id: str) -> None:
    await _job_with_rows(store, job_id, end="COMPLETED")
    await _age(backend, job_id)
    assert (await store.prune_jobs(older_than=HOUR, statuses=FINISHED)).job_ids == (job_id,)


async def test_a_fork_into_a_pruned_id_is_refused(store: CheckpointStore, backend: Backend) -> None:
    # Like a create: a rewind --as retried after the prune must not run the job again.
    await _pruned(store, backend, "gone")
    await _job_with_rows(store, "src", end="COMPLETED")
    (kept,) = await store.kept_checkpoints("src")
    source = await store.get_job("src")
    assert source is not None
    target = RewindTarget(kept.step, source.attempt, kept.checkpoint_id, "fork-c1", kept.data, kept.crc, 1)
    with pytest.raises(JobStateConflict, match=r"cannot fork job src into gone: job gone was pruned at 20"):
        await store.rewind("src", target, actor="op", reason="", new_id="gone")
    assert await store.get_job("gone") is None and await store.pruned_job("gone") is not None
    assert (await store.rewind("src", target, actor="op", reason="", new_id="free")).id == "free"


async def test_a_child_started_into_a_pruned_id_is_refused(store: CheckpointStore, backend: Backend) -> None:
    # A parent that starts its pruned child again (a step run again long after) must not run it twice.
    await _pruned(store, backend, "gone")
    await store.create_job("parent", "a", {})
    await store.claim("parent", 1)
    refused = r"ctx.start_job: job gone was pruned at 20.*its id cannot be used again"
    with pytest.raises(ChildJobError, match=refused):
        await store.start_child("parent", 1, "gone", "a", {}, invocation_id="inv-1", detached=False)
    assert await store.get_job("gone") is None and await store.pruned_job("gone") is not None


async def test_every_operation_on_a_pruned_id_says_when_it_was_pruned(
    store: CheckpointStore, backend: Backend
) -> None:
    from agentlife import Client

    await _pruned(store, backend, "gone")
    url = backend.location if backend.kind == "postgresql" else f"sqlite:///{backend.location}"
    pruned = r"^job gone was pruned at \d{4}-\d\d-\d\dT.*\(COMPLETED, agent a, finished "
    async with await Client.connect(url) as client:
        operations: dict[str, Callable[[], Awaitable[Any]]] = {
            "result": lambda: client.result("gone", 1),
            "send": lambda: client.send("gone", "ping"),
            "approve": lambda: client.approve("gone"),
            "reject": lambda: client.reject("gone"),
            "cancel": lambda: client.cancel("gone"),
            "retry": lambda: client.retry("gone"),
            "pause": lambda: client.pause("gone"),
            "resume": lambda: client.resume("gone"),
            "rewind": lambda: client.rewind("gone", 1),
        }
        for name, operation in operations.items():
            with pytest.raises(JobNotFound, match=pruned) as caught:
                await operation()
            assert caught.value is not None, name
        with pytest.raises(JobNotFound, match=pruned):
            async for _ in client.events("gone"):
                pass
        with pytest.raises(JobNotFound, match=r"^job never does not exist$"):
            await client.send("never", "ping")
    with pytest.raises(JobNotFound, match=pruned):
        await store.claim("gone", 2)
    with pytest.raises(JobNotFound, match=pruned):
        await store.load_checkpoint("gone")


async def test_the_pruned_ids_among_a_list_and_tombstones_expired_without_a_prune(
    store: CheckpointStore, backend: Backend
) -> None:
    await _pruned(store, backend, "gone")
    await _job_with_rows(store, "live", end="COMPLETED")
    assert await store.pruned_ids(["gone", "live", "never"]) == {"gone"}
    assert await store.pruned_ids([]) == set()
    assert await store.expire_tombstones(HOUR) == 0
    at = time.time() - 2 * HOUR
    when = at if backend.kind == "sqlite" else datetime.fromtimestamp(at, UTC)
    await backend.raw(f"UPDATE {backend.tables.pruned} SET pruned_at = $1", when)
    assert await store.expire_tombstones(HOUR) == 1
    assert await store.pruned_ids(["gone"]) == set() and await store.pruned_job("gone") is None


async def test_old_tombstones_are_deleted_and_free_the_id(store: CheckpointStore, backend: Backend) -> None:
    await _job_with_rows(store, "gone", end="COMPLETED")
    await _age(backend, "gone")
    await store.prune_jobs(older_than=HOUR, statuses=FINISHED)
    kept = await store.prune_jobs(older_than=HOUR, statuses=FINISHED, tombstones_older_than=HOUR)
    assert kept.tombstones == 0 and await store.pruned_job("gone") is not None

    at = time.time() - 2 * HOUR
    when = at if backend.kind == "sqlite" else datetime.fromtimestamp(at, UTC)
    await backend.raw(f"UPDATE {backend.tables.pruned} SET pruned_at = $1", when)
    dropped = await store.prune_jobs(older_than=HOUR, statuses=FINISHED, tombstones_older_than=HOUR)
    assert dropped.tombstones == 1 and await store.pruned_job("gone") is None
    await store.create_job("gone", "a", {})  # the id is free again


async def test_two_prunes_at_once_take_different_jobs(make_store: StoreFactory, backend: Backend) -> None:
    first, second = await make_store(), await make_store()
    ids = [f"j{n:02}" for n in range(30)]
    for job_id in ids:
        await first.create_job(job_id, "a", {})
        await first.claim(job_id, 1)
        await first.set_status(job_id, 1, "COMPLETED")
    await _age(backend, *ids)
    results: list[tuple[str, ...]] = []

    async def prune(store: CheckpointStore) -> None:
        results.append((await store.prune_jobs(older_than=HOUR, statuses=FINISHED, batch_size=2)).job_ids)

    async with anyio.create_task_group() as tg:
        tg.start_soon(prune, first)
        tg.start_soon(prune, second)

    assert sorted(results[0] + results[1]) == ids  # every job once, none twice
    assert await first.list_jobs() == []
    assert await _orphans(backend) == dict.fromkeys(_tables(backend), 0)


async def test_a_row_a_worker_holds_locked_is_skipped_not_waited_for(postgres_url: str) -> None:
    """A prune racing a worker's write on PostgreSQL: skipped while held, judged by what it committed.

    (SQLite has one writer at a time: the prune's batch and the worker's write cannot interleave.)
    """
    import asyncpg

    backend = Backend("postgresql", postgres_url, TableNames())
    store = backend.open_store()
    await store.open()
    await store.init_schema()

    for job_id in ("held", "free"):
        await store.create_job(job_id, "a", {})
        await store.claim(job_id, 1)
        await store.set_status(job_id, 1, "COMPLETED")
    await _age(backend, "held", "free")
    worker = await asyncpg.connect(backend.location)
    try:
        tx = worker.transaction()
        await tx.start()
        # The worker's write in progress: a retry that makes the job live again, not yet committed.
        await worker.execute("UPDATE job SET status = 'PENDING', updated_at = now() WHERE id = 'held'")
        with anyio.fail_after(30):  # SKIP LOCKED: the prune does not wait for the worker's transaction
            gone = await store.prune_jobs(older_than=HOUR, statuses=FINISHED)
        assert gone.job_ids == ("free",)
        await tx.commit()
    finally:
        await worker.close()
    # Committed live: never pruned, whatever its age was when the prune began.
    assert (await store.prune_jobs(older_than=0, statuses=FINISHED)).count == 0
    record = await store.get_job("held")
    assert record is not None and record.status == JobStatus.PENDING
    await store.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"statuses": ["RUNNING"]}, "'RUNNING' is not a finished status"),
        ({"statuses": ["PAUSED"]}, "'PAUSED' is not a finished status"),
        ({"statuses": []}, "non-empty"),
        ({"older_than": float("nan")}, "finite"),
        ({"older_than": -1.0}, ">= 0"),
        ({"batch_size": 0}, "batch_size 0"),
    ],
)
async def test_bad_arguments_are_one_line_errors(
    store: CheckpointStore, kwargs: dict[str, object], message: str
) -> None:
    await store.create_job("x", "a", {})
    args: dict[str, object] = {"older_than": HOUR, "statuses": FINISHED, **kwargs}
    with pytest.raises(ConfigError, match=message) as caught:
        await store.prune_jobs(**args)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)
    assert await store.get_job("x") is not None


async def test_rows_whose_id_is_not_text_are_left_and_stop_nothing(tmp_path: Path) -> None:
    """SQLite rows another client wrote: a BLOB id, a text id that is not UTF-8, both finished and old."""
    import sqlite3

    from agentlife.stores import SQLiteStore

    store = SQLiteStore(tmp_path / "agentlife.db")
    await store.open()
    try:
        await store.create_job("good", "a", {})
        conn = sqlite3.connect(tmp_path / "agentlife.db", isolation_level=None)
        try:
            for key in (b"\x00blob-id", "CAST(X'ff6e6f7475746638' AS TEXT)"):
                value = "?" if isinstance(key, bytes) else key
                args = (key,) if isinstance(key, bytes) else ()
                columns = "id, agent_id, status, updated_at"
                conn.execute(f"INSERT INTO job ({columns}) VALUES ({value}, 'a', 'COMPLETED', 1.0)", args)
            conn.execute("UPDATE job SET status = 'COMPLETED', updated_at = 2.0 WHERE id = 'good'")
        finally:
            conn.close()
        for batch_size in (1, 500):
            dry = await store.prune_jobs(
                older_than=HOUR, statuses=FINISHED, batch_size=batch_size, dry_run=True
            )
            assert dry.job_ids == ("good",)
        done = await store.prune_jobs(older_than=HOUR, statuses=FINISHED, batch_size=1)
        assert done.job_ids == ("good",)
        conn = sqlite3.connect(tmp_path / "agentlife.db", isolation_level=None)
        try:
            assert conn.execute("SELECT count(*) FROM job").fetchone() == (2,)  # the others are left
        finally:
            conn.close()
    finally:
        await store.close()
