"""``job pause`` / ``job resume`` on the stores: a paused row is claimed by no worker and touched by no
reaper, keeps what it was doing, and goes back to it on resume; run unchanged against SQLiteStore and a
real PostgreSQL, as the store contract is."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from test_store_contract import Backend, StoreFactory

from agentlife import JobNotFound, JobStateConflict, StoreUnavailable
from agentlife.stores import ApprovalRequest, CheckpointStore, JobStatus, PostgresStore, TableNames

pytestmark = pytest.mark.anyio

THRESHOLD = 300.0
DEPLOY = ApprovalRequest("p-1/0/1", "digest-prod", "deploy", step=0, attempt=1)


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


async def _pause(store: CheckpointStore, job_id: str, reason: str = "looking into it") -> str:
    return (await store.pause(job_id, reason=reason, actor="ops@host")).status


async def test_a_pending_job_paused_is_claimed_by_no_worker_until_resumed(store: CheckpointStore) -> None:
    await store.create_job("p-1", "agent-a", {"n": 1})
    assert await _pause(store, "p-1") == "PAUSED"
    assert await store.claim_next("agent-a") is None
    assert await store.claim_next() is None
    assert (await store.count_runnable()).get("agent-a", 0) == 0
    entry = (await store.get_job("p-1")).error[-1]  # type: ignore[union-attr]
    assert (entry["error_class"], entry["message"], entry["actor"], entry["paused_from"]) == (
        "Paused",
        "looking into it",
        "ops@host",
        "PENDING",
    )
    resumed = await store.resume("p-1", actor="ops@host")
    assert resumed.status == "PENDING"
    assert resumed.error[-1]["error_class"] == "Resumed"
    claimed = await store.claim_next("agent-a")
    assert claimed is not None and (claimed.id, claimed.attempt) == ("p-1", 1)


async def test_a_retrying_job_keeps_its_backoff_through_a_pause(store: CheckpointStore) -> None:
    await store.create_job("p-1", "agent-a", None)
    claimed = await store.claim_next()
    assert claimed is not None
    assert await store.release("p-1", claimed.attempt, JobStatus.RETRYING, delay_seconds=3600)
    paused = await store.pause("p-1", reason="r", actor="ops@host")
    before = paused.not_before
    assert paused.status == "PAUSED" and before is not None and before > time.time() + 3000
    resumed = await store.resume("p-1", actor="ops@host")
    assert (resumed.status, resumed.not_before) == ("RETRYING", pytest.approx(before))
    assert await store.claim_next() is None  # still in its backoff


async def test_an_event_sent_to_a_paused_wait_is_kept_and_wakes_it_on_resume(store: CheckpointStore) -> None:
    await store.create_job("p-1", "agent-a", None)
    claimed = await store.claim_next()
    assert claimed is not None
    wait = {"kind": "event", "events": ["go"]}
    assert await store.park_waiting("p-1", claimed.attempt, time.time() + 3600, wait)
    assert await _pause(store, "p-1") == "PAUSED"
    assert await store.send_event("p-1", "go", {"ok": True}) >= 1  # accepted and recorded
    row = await store.get_job("p-1")
    assert row is not None and row.status == "PAUSED"
    assert await store.claim_next() is None  # the event does not wake a paused job
    assert await store.kept_events("p-1") == {"go": 1}
    resumed = await store.resume("p-1", actor="ops@host")
    assert resumed.status == "WAITING"
    again = await store.claim_next()  # the event came while paused: runnable at once
    assert again is not None and again.id == "p-1"


async def test_a_paused_wait_without_its_event_keeps_its_timer(store: CheckpointStore) -> None:
    await store.create_job("p-1", "agent-a", None)
    claimed = await store.claim_next()
    assert claimed is not None
    until = time.time() + 3600
    assert await store.park_waiting("p-1", claimed.attempt, until, {"kind": "event", "events": ["go"]})
    await _pause(store, "p-1")
    resumed = await store.resume("p-1", actor="ops@host")
    assert (resumed.status, resumed.not_before) == ("WAITING", pytest.approx(until, abs=1))
    assert await store.claim_next() is None


async def test_a_job_paused_at_its_approval_is_approved_only_after_resume(store: CheckpointStore) -> None:
    await store.create_job("p-1", "agent-a", None)
    await store.claim("p-1", 1)
    assert (await store.request_approval("p-1", 1, DEPLOY)).status == "WAITING_FOR_APPROVAL"
    assert await _pause(store, "p-1") == "PAUSED"
    with pytest.raises(JobStateConflict, match="cannot approve job p-1: it is PAUSED"):
        await store.approve("p-1")
    # The parked process polling the row sees the pause and parks (it never asks again over it).
    state = await store.get_approval("p-1")
    assert state is not None and state.decide(DEPLOY) == "paused"
    assert (await store.request_approval("p-1", 1, DEPLOY)).status == "PAUSED"
    resumed = await store.resume("p-1", actor="ops@host")
    assert resumed.status == "WAITING_FOR_APPROVAL"
    approval = await store.get_approval("p-1")
    assert approval is not None and approval.request is not None  # the request was kept
    assert (await store.approve("p-1")).status in ("RUNNING", "PENDING")


async def test_a_running_job_carries_the_request_until_it_hands_the_row_back(store: CheckpointStore) -> None:
    await store.create_job("p-1", "agent-a", None)
    claimed = await store.claim_next()
    assert claimed is not None
    assert not await store.pause_requested("p-1", claimed.attempt)
    assert await _pause(store, "p-1") == "RUNNING"
    assert await store.pause_requested("p-1", claimed.attempt)
    assert not await store.pause_requested("p-1", claimed.attempt + 1)  # another attempt's question
    await store.heartbeat("p-1", claimed.attempt)  # the process is not fenced out
    with pytest.raises(JobStateConflict, match="already requested"):
        await _pause(store, "p-1")
    assert await store.release("p-1", claimed.attempt, JobStatus.PENDING)  # its step boundary
    row = await store.get_job("p-1")
    assert row is not None and row.status == "PAUSED"
    assert await store.claim_next() is None
    assert (await store.resume("p-1", actor="ops@host")).status == "PENDING"


async def test_a_running_job_that_parks_at_a_wait_with_a_request_is_paused_there(
    store: CheckpointStore,
) -> None:
    await store.create_job("p-1", "agent-a", None)
    claimed = await store.claim_next()
    assert claimed is not None
    await _pause(store, "p-1")
    assert await store.park_waiting("p-1", claimed.attempt, time.time() + 3600, {"kind": "sleep"})
    assert (await store.get_job("p-1")).status == "PAUSED"  # type: ignore[union-attr]
    assert (await store.resume("p-1", actor="ops@host")).status == "WAITING"


async def test_a_resume_withdraws_a_request_the_process_has_not_acted_on(store: CheckpointStore) -> None:
    await store.create_job("p-1", "agent-a", None)
    claimed = await store.claim_next()
    assert claimed is not None
    await _pause(store, "p-1")
    assert (await store.resume("p-1", actor="ops@host")).status == "RUNNING"
    assert not await store.pause_requested("p-1", claimed.attempt)
    assert await store.release("p-1", claimed.attempt, JobStatus.PENDING)
    assert (await store.get_job("p-1")).status == "PENDING"  # type: ignore[union-attr]


async def test_the_reaper_pauses_a_dead_processs_job_whose_pause_was_requested(
    store: CheckpointStore,
) -> None:
    await store.create_job("p-1", "agent-a", None)
    claimed = await store.claim_next()
    assert claimed is not None
    await _pause(store, "p-1")
    (decision,) = await store.reap(THRESHOLD, now=time.time() + THRESHOLD + 60)
    assert decision.status == "PAUSED"
    row = await store.get_job("p-1")
    assert row is not None and row.status == "PAUSED"
    assert row.error[-1]["error_class"] == "HeartbeatStale"  # the crash is recorded, counted as one
    assert await store.reap(THRESHOLD, now=time.time() + 2 * THRESHOLD) == []  # no reaper touches it
    resumed = await store.resume("p-1", actor="ops@host")
    assert resumed.status == "RETRYING"  # the retry it was reaped into, with its backoff


async def test_a_paused_job_can_be_cancelled_and_a_retry_drops_an_old_request(store: CheckpointStore) -> None:
    await store.create_job("p-1", "agent-a", None)
    await _pause(store, "p-1")
    assert (await store.cancel("p-1", "not needed")).status == "FAILED"
    await store.create_job("p-2", "agent-a", None)
    claimed = await store.claim_next()
    assert claimed is not None and claimed.id == "p-2"
    await _pause(store, "p-2")  # requested, then the job fails before its next boundary
    await store.set_status("p-2", claimed.attempt, JobStatus.FAILED)
    await store.retry("p-2")
    again = await store.claim_next()
    assert again is not None and again.id == "p-2"
    assert not await store.pause_requested("p-2", again.attempt)


@pytest.mark.parametrize("status", ["COMPLETED", "FAILED", "DEAD_LETTER", "PAUSED"])
async def test_a_pause_of_an_ended_or_paused_job_is_a_clear_conflict_and_changes_nothing(
    store: CheckpointStore, backend: Backend, status: str
) -> None:
    await store.create_job("p-1", "agent-a", None)
    await backend.raw(f"UPDATE {backend.tables.job} SET status = '{status}' WHERE id = 'p-1'")
    before = await store.get_job("p-1")
    with pytest.raises(JobStateConflict, match=f"cannot pause job p-1: it is {status} "):
        await _pause(store, "p-1")
    assert await store.get_job("p-1") == before


async def test_resume_of_a_job_not_paused_or_unknown_is_a_clear_error(store: CheckpointStore) -> None:
    await store.create_job("p-1", "agent-a", None)
    with pytest.raises(JobStateConflict, match="cannot resume job p-1: it is PENDING"):
        await store.resume("p-1", actor="ops@host")
    claimed = await store.claim_next()
    assert claimed is not None
    with pytest.raises(JobStateConflict, match="it is RUNNING and not paused"):
        await store.resume("p-1", actor="ops@host")
    with pytest.raises(JobNotFound, match="job nope does not exist"):
        await store.resume("nope", actor="ops@host")
    with pytest.raises(JobNotFound, match="job nope does not exist"):
        await _pause(store, "nope")


@pytest.mark.parametrize(("left", "right"), [("pause", "pause"), ("resume", "resume")])
async def test_two_operators_at_once_exactly_one_wins(
    make_store: StoreFactory, left: str, right: str
) -> None:
    first, second = await make_store(), await make_store()
    ids = [f"race-{i}" for i in range(10)]
    for job_id in ids:
        await first.create_job(job_id, "agent-a", None)
        if left == "resume":
            await _pause(first, job_id)
    winners: dict[str, list[str]] = {job_id: [] for job_id in ids}
    refusals: list[str] = []

    async def run(store: CheckpointStore, job_id: str, name: str) -> None:
        try:
            if name == "pause":
                await _pause(store, job_id)
            else:
                await store.resume(job_id, actor="ops@host")
        except JobStateConflict as exc:
            refusals.append(str(exc))
            return
        winners[job_id].append(name)

    async with anyio.create_task_group() as tg:
        for job_id in ids:
            tg.start_soon(run, first, job_id, left)
            tg.start_soon(run, second, job_id, right)
    assert all(len(names) == 1 for names in winners.values()), winners
    assert len(refusals) == len(ids)
    assert all(re.match(f"cannot {left} job race-\\d+: it is ", text) for text in refusals), refusals
    for job_id in ids:
        row = await first.get_job(job_id)
        assert row is not None and row.status == ("PAUSED" if left == "pause" else "PENDING")


async def test_ten_thousand_paused_rows_are_not_read_by_the_claim(postgres_url: str) -> None:
    import asyncpg

    from agentlife.stores._pg_statements import pg_statements

    store = PostgresStore(postgres_url)
    await store.open()
    await store.init_schema()
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(
            "INSERT INTO job (id, agent_id, status, payload, updated_at, not_before, paused)"
            " SELECT 'paused-' || lpad(i::text, 5, '0'), 'agent-a', 'PAUSED', NULL, now(),"
            " now() - interval '1 hour', '{\"from\": \"PENDING\"}' FROM generate_series(1, 10000) AS i"
        )
        await store.create_job("fresh", "agent-a", None)
        await conn.execute("ANALYZE job")
        sql = pg_statements(TableNames()).claim_agent
        values = sql.values({"owner": "x", "agent_id": "agent-a"})
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN (COSTS OFF) " + sql.text, *values))
        assert "Seq Scan on job" not in plan, plan
        # Each look at the job table is the partial index of runnable rows, whose predicate leaves every
        # PAUSED row out: the claim never reads one.
        scans = re.findall(r"(?:Index|Index Only|Bitmap Index) Scan using (\w+) on job", plan)
        assert scans and set(scans) <= {"job_agent_claim_idx", "job_agent_due_idx", "job_pkey"}, plan
        for index in ("job_agent_claim_idx", "job_agent_due_idx"):
            definition = await conn.fetchval("SELECT indexdef FROM pg_indexes WHERE indexname = $1", index)
            assert "'PENDING'" in definition and "PAUSED" not in definition, definition
        claimed = await store.claim_next("agent-a")
        assert claimed is not None and claimed.id == "fresh"
    finally:
        await conn.close()
        await store.close()


async def test_a_table_from_before_pauses_refuses_a_pause_until_db_init(postgres_url: str) -> None:
    import asyncpg

    first = PostgresStore(postgres_url)
    await first.open()
    await first.init_schema()
    await first.create_job("p-1", "agent-a", None)
    await first.close()
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute("ALTER TABLE job DROP COLUMN paused")
    finally:
        await conn.close()
    old = PostgresStore(postgres_url)
    await old.open()
    try:
        with pytest.raises(StoreUnavailable, match="run `python -m agentlife db init`"):
            await old.pause("p-1", reason="r", actor="a")
        assert (await old.get_job("p-1")).status == "PENDING"  # type: ignore[union-attr]
        claimed = await old.claim_next()  # jobs run on as before
        assert claimed is not None and not await old.pause_requested("p-1", claimed.attempt)
    finally:
        await old.close()
    init = PostgresStore(postgres_url)
    await init.open()
    await init.init_schema()  # db init adds the column to the existing table
    await init.close()
    upgraded = PostgresStore(postgres_url)
    await upgraded.open()
    try:
        assert (await upgraded.pause("p-1", reason="r", actor="a")).status == "RUNNING"
    finally:
        await upgraded.close()


@pytest.mark.parametrize("column", ["NULL", "'[1, 2]'", '\'{"from": "COMPLETED"}\'', "'{\"from\": 7}'"])
async def test_a_row_paused_by_another_client_resumes_as_pending(
    store: CheckpointStore, backend: Backend, column: str
) -> None:
    await store.create_job("p-1", "agent-a", None)
    value = column if backend.kind == "sqlite" or column == "NULL" else f"{column}::jsonb"
    await backend.raw(f"UPDATE {backend.tables.job} SET status = 'PAUSED', paused = {value} WHERE id = 'p-1'")
    assert await store.claim_next() is None
    assert (await store.resume("p-1", actor="ops@host")).status == "PENDING"  # never a terminal status


async def test_a_request_column_that_is_not_json_is_no_request(tmp_path: Path) -> None:
    backend = Backend("sqlite", str(tmp_path / "agentlife.db"), TableNames())
    store = backend.open_store()
    await store.open()
    try:
        await store.init_schema()
        await store.create_job("p-1", "agent-a", None)
        claimed = await store.claim_next()
        assert claimed is not None
        await backend.raw("UPDATE job SET paused = 'not json' WHERE id = 'p-1'")
        assert not await store.pause_requested("p-1", claimed.attempt)
        assert await store.release("p-1", claimed.attempt, JobStatus.PENDING)
        assert (await store.get_job("p-1")).status == "PENDING"  # type: ignore[union-attr]
        assert await _pause(store, "p-1") == "PAUSED"  # the column is rewritten, nothing else refused
    finally:
        await store.close()
