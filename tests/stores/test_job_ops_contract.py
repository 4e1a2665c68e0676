"""Job operations of the stores (claim of the next runnable job, approve / reject / cancel / retry, the
zombie reaper), run unchanged against SQLiteStore and a real PostgreSQL, as the store contract is."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_store_contract import Backend, StoreFactory

from agentlife import AttemptFenced, ConfigError, JobNotFound, JobStateConflict
from agentlife.constants import Constants
from agentlife.stores import ApprovalRequest, CheckpointStore, JobStatus, ReapDecision, TableNames

pytestmark = pytest.mark.anyio


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


THRESHOLD = 300.0


async def _set(backend: Backend, job_id: str, **columns: Any) -> None:
    """Write columns straight into the row (``*_at`` / ``not_before`` as unix times, ``error`` as a list)."""
    import orjson

    t = backend.tables.job
    if backend.kind == "sqlite":
        conn = sqlite3.connect(backend.location, isolation_level=None)
        try:
            for name, value in columns.items():
                if name in ("error", "approval") and not isinstance(value, str):
                    value = orjson.dumps(value).decode()
                conn.execute(f"UPDATE {t} SET {name} = ? WHERE id = ?", (value, job_id))
        finally:
            conn.close()
        return
    import asyncpg

    conn = await asyncpg.connect(backend.location)
    try:
        for name, value in columns.items():
            cast = ""
            if name in ("error", "approval"):
                value, cast = orjson.dumps(value).decode(), "::jsonb"
            elif isinstance(value, float):
                value = datetime.fromtimestamp(value, UTC)
            await conn.execute(f"UPDATE {t} SET {name} = $1{cast} WHERE id = $2", value, job_id)
    finally:
        await conn.close()


async def _create(store: CheckpointStore, *ids: str, agent: str = "agent-a") -> None:
    for job_id in ids:
        await store.create_job(job_id, agent, {"n": job_id})


# -- claim_next ---------------------------------------------------------------------------------------


async def test_claim_next_takes_the_oldest_runnable_job_and_bumps_its_attempt(store: CheckpointStore) -> None:
    await _create(store, "j-c", "j-a", "j-b")  # created in this order: not alphabetical
    claimed = [await store.claim_next() for _ in range(3)]
    assert [c.id for c in claimed if c] == ["j-c", "j-a", "j-b"]
    for record in claimed:
        assert record is not None
        assert (record.status, record.attempt) == (JobStatus.RUNNING, 1)
        assert record.heartbeat_at is not None and abs(record.heartbeat_at - time.time()) < 60
    assert await store.claim_next() is None
    # The claim token is this store's: its writes with the new attempt go through.
    await store.heartbeat("j-c", 1)


async def test_claim_next_filters_by_agent(store: CheckpointStore) -> None:
    await _create(store, "a-1", agent="agent-a")
    await _create(store, "b-1", agent="agent-b")
    claimed = await store.claim_next("agent-b")
    assert claimed is not None and claimed.id == "b-1"
    assert await store.claim_next("agent-b") is None
    assert (await store.get_job("a-1")).status == JobStatus.PENDING


async def test_claim_next_waits_for_not_before_of_a_retrying_row(
    store: CheckpointStore, backend: Backend
) -> None:
    await _create(store, "j-1")
    await _set(backend, "j-1", status="RETRYING", attempt=3, not_before=time.time() + 3600)
    assert await store.claim_next() is None
    assert await store.count_runnable() == {}
    await _set(backend, "j-1", not_before=time.time() - 1)
    assert await store.count_runnable() == {"agent-a": 1}
    claimed = await store.claim_next()
    assert claimed is not None and (claimed.id, claimed.attempt, claimed.status) == ("j-1", 4, "RUNNING")


async def test_claim_next_skips_running_parked_and_finished_rows(
    store: CheckpointStore, backend: Backend
) -> None:
    await _create(store, *(f"j-{s}" for s in JobStatus))
    for status in JobStatus:
        await _set(backend, f"j-{status}", status=str(status))
    got = {(await store.claim_next()).id for _ in range(3)}  # type: ignore[union-attr]
    assert got == {"j-PENDING", "j-RETRYING", "j-WAITING"}  # a WAITING row whose time has come resumes
    assert await store.claim_next() is None


async def test_a_job_parked_at_a_wait_is_claimed_only_once_its_time_has_come(
    store: CheckpointStore, backend: Backend
) -> None:
    await _create(store, "j-1")
    row = await store.claim_next()
    assert row is not None
    until = time.time() + 3600
    what = {"kind": "sleep", "until": until, "invocation_id": "j-1/0/1"}
    assert not await store.park_waiting("j-1", row.attempt + 1, until, what)  # not this attempt's
    assert await store.park_waiting("j-1", row.attempt, until, what)
    assert not await store.park_waiting("j-1", row.attempt, until, what)  # no longer RUNNING
    wait = await store.get_wait("j-1")
    assert wait is not None and (wait.status, wait.waiting_for) == ("WAITING", what)
    assert wait.until == pytest.approx(until, abs=1e-3)
    assert await store.claim_next() is None and await store.count_runnable() == {}
    await _set(backend, "j-1", not_before=time.time() - 1)
    resumed = await store.claim_next()
    assert resumed is not None and (resumed.id, resumed.attempt, resumed.status) == ("j-1", 2, "RUNNING")
    assert await store.get_wait("nope") is None
    shown = await store.get_wait("j-1")
    assert shown is not None and (shown.until, shown.waiting_for) == (None, {})  # only a WAITING row waits


async def test_a_waiting_job_counts_as_runnable_once_a_timer_an_event_or_a_childs_end_made_it_due(
    store: CheckpointStore, backend: Backend
) -> None:
    # What an autoscaler reads to start a worker for a Deployment at zero replicas: a WAITING row whose
    # timer came due, whose event arrived or whose child ended is work, as a PENDING one is; a row still
    # waiting, or woken by an event it does not wait for, is not.
    names = ("w-timer", "w-event", "w-parent", "w-asleep", "w-unasked", "r-busy")
    await _create(store, *names)
    rows = {row.id: row for row in [await store.claim_next() for _ in names] if row is not None}
    far = time.time() + 3600
    parent = rows["w-parent"]
    assert await store.start_child(
        "w-parent", parent.attempt, "kid", "agent-b", None, invocation_id="w-parent/0/1"
    )
    waits = {
        "w-timer": {"kind": "sleep"},
        "w-event": {"kind": "event", "events": ["answer"]},
        "w-parent": {"kind": "jobs", "jobs": ["kid"]},
        "w-asleep": {"kind": "sleep"},
        "w-unasked": {"kind": "event", "events": ["answer"]},
    }
    for job_id, what in waits.items():
        assert await store.park_waiting(job_id, rows[job_id].attempt, far, what)
    assert await store.count_runnable() == {"agent-b": 1}  # the child, PENDING

    await _set(backend, "w-timer", not_before=time.time() - 1)  # its timer came due
    await store.send_event("w-event", "answer")
    await store.send_event("w-unasked", "other")  # kept for later: it wakes nothing
    kid = await store.claim_next("agent-b")
    assert kid is not None
    await store.set_status("kid", kid.attempt, JobStatus.COMPLETED)  # the child's end wakes its parent
    assert await store.count_runnable() == {"agent-a": 3}
    if backend.kind == "postgresql":
        # The documented KEDA query, run as KEDA runs it: the three due waits and the job still running.
        assert await backend.raw(keda_query("agent-a")) == [(4,)]


def keda_query(agent_id: str) -> str:
    """The PostgreSQL scaler's query of the KEDA example in docs/workers.md, for ``agent_id``."""
    import yaml

    page = (Path(__file__).parent.parent.parent / "docs" / "workers.md").read_text()
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", page, re.S) if "kind: ScaledObject" in b]
    [trigger] = yaml.safe_load(block)["spec"]["triggers"]
    query = str(trigger["metadata"]["query"])
    assert "agent_id = 'reviewer'" in query
    return query.replace("agent_id = 'reviewer'", f"agent_id = '{agent_id}'")


async def test_cancel_ends_a_waiting_job_and_its_late_park_changes_nothing(store: CheckpointStore) -> None:
    await _create(store, "j-1")
    row = await store.claim_next()
    assert row is not None
    assert await store.park_waiting("j-1", row.attempt, time.time() + 3600, {"kind": "sleep"})
    cancelled = await store.cancel("j-1", "not needed")
    assert cancelled.status == "FAILED"
    assert not await store.park_waiting("j-1", row.attempt, time.time() + 3600, {"kind": "sleep"})
    assert (await store.get_job("j-1")).status == "FAILED"  # type: ignore[union-attr]


async def test_a_waiting_column_written_badly_reads_as_an_empty_wait(
    store: CheckpointStore, backend: Backend
) -> None:
    await _create(store, "j-1")
    row = await store.claim_next()
    assert row is not None
    assert await store.park_waiting("j-1", row.attempt, time.time() + 60, {"kind": "sleep"})
    bad = "'[1, 2]'" if backend.kind == "sqlite" else "'[1, 2]'::jsonb"
    await backend.raw(f"UPDATE {backend.tables.job} SET waiting = {bad} WHERE id = 'j-1'")
    wait = await store.get_wait("j-1")
    assert wait is not None and (wait.status, wait.waiting_for) == ("WAITING", {})


async def test_a_row_without_not_before_is_runnable_first(store: CheckpointStore, backend: Backend) -> None:
    await _create(store, "j-new", "j-legacy")
    await _set(backend, "j-legacy", not_before=None)  # written by a control plane that knows no not_before
    claimed = await store.claim_next()
    assert claimed is not None and claimed.id == "j-legacy"


async def test_four_concurrent_claimers_take_fifty_rows_each_exactly_once(
    make_store: StoreFactory,
) -> None:
    first = await make_store()
    await _create(first, *(f"job-{i:02d}" for i in range(50)))
    claimers = [first, *[await make_store() for _ in range(3)]]
    taken: list[list[str]] = [[] for _ in claimers]

    async def drain(index: int, claimer: CheckpointStore) -> None:
        while (record := await claimer.claim_next()) is not None:
            assert record.attempt == 1
            taken[index].append(record.id)

    async with anyio.create_task_group() as tg:
        for index, claimer in enumerate(claimers):
            tg.start_soon(drain, index, claimer)
    every = [job_id for ids in taken for job_id in ids]
    assert sorted(every) == [f"job-{i:02d}" for i in range(50)]
    assert len(set(every)) == 50
    rows = await first.list_jobs(limit=100)
    assert {(r.status, r.attempt) for r in rows} == {("RUNNING", 1)}


async def test_claim_next_skips_a_row_locked_by_another_claimer_on_postgres(postgres_url: str) -> None:
    import asyncpg

    from agentlife.stores import PostgresStore

    store = PostgresStore(postgres_url, create_schema=True)
    await store.open()
    try:
        await _create(store, "first", "second")
        holder = await asyncpg.connect(postgres_url)
        try:
            async with holder.transaction():
                await holder.execute("SELECT 1 FROM job WHERE id = 'first' FOR UPDATE")
                # Not blocked behind the lock: SKIP LOCKED hands out the next row at once.
                with anyio.fail_after(5):
                    claimed = await store.claim_next()
                assert claimed is not None and claimed.id == "second"
        finally:
            await holder.close()
        claimed = await store.claim_next()
        assert claimed is not None and claimed.id == "first"
    finally:
        await store.close()


# -- list, count --------------------------------------------------------------------------------------


async def test_list_jobs_filters_by_status_and_agent_with_a_limit(
    store: CheckpointStore, backend: Backend
) -> None:
    await _create(store, "a-1", "a-2", "a-3", agent="agent-a")
    await _create(store, "b-1", agent="agent-b")
    await _set(backend, "a-2", status="DEAD_LETTER")
    assert {r.id for r in await store.list_jobs()} == {"a-1", "a-2", "a-3", "b-1"}
    assert [r.id for r in await store.list_jobs(status="DEAD_LETTER")] == ["a-2"]
    assert {r.id for r in await store.list_jobs(agent_id="agent-a", status="PENDING")} == {"a-1", "a-3"}
    assert len(await store.list_jobs(limit=2)) == 2
    assert await store.count_runnable() == {"agent-a": 2, "agent-b": 1}


# -- approve, reject, cancel, retry -------------------------------------------------------------------


async def test_approve_a_parked_job_without_a_live_process_makes_it_pending(
    store: CheckpointStore, backend: Backend
) -> None:
    await _create(store, "j-1")
    await _set(backend, "j-1", status="WAITING_FOR_APPROVAL", attempt=2)
    approved = await store.approve("j-1")
    assert (approved.status, approved.attempt) == ("PENDING", 2)
    claimed = await store.claim_next()
    assert claimed is not None and (claimed.id, claimed.attempt) == ("j-1", 3)


async def test_approve_a_job_parked_by_a_live_process_hands_it_back_running(store: CheckpointStore) -> None:
    await _create(store, "j-1")
    await store.claim("j-1", 1)
    await store.set_status("j-1", 1, JobStatus.WAITING_FOR_APPROVAL)
    approved = await store.approve("j-1")
    assert (approved.status, approved.attempt) == ("RUNNING", 1)
    await store.set_status("j-1", 1, JobStatus.RUNNING)  # the parked process carries on, unfenced


DEPLOY = ApprovalRequest("j-1/0/1", "digest-prod", "deploy", step=0, attempt=1)


async def _parked(store: CheckpointStore, request: ApprovalRequest = DEPLOY) -> None:
    """j-1 claimed by ``store`` (attempt 1) and parked on ``request``."""
    await _create(store, "j-1")
    await store.claim("j-1", 1)
    state = await store.request_approval("j-1", 1, request)
    assert (state.status, state.decide(request)) == ("WAITING_FOR_APPROVAL", "waiting")


async def test_a_park_records_the_call_on_the_row_in_the_same_write_as_its_status(
    store: CheckpointStore,
) -> None:
    await _parked(store)
    state = await store.get_approval("j-1")
    assert state is not None and state.status == "WAITING_FOR_APPROVAL"
    assert state.request is not None
    assert {k: state.request[k] for k in ("invocation_id", "digest", "tool", "step", "attempt")} == {
        "invocation_id": "j-1/0/1",
        "digest": "digest-prod",
        "tool": "deploy",
        "step": 0,
        "attempt": 1,
    }
    assert state.grants == () and state.rejection is None
    assert await store.get_approval("ghost") is None


async def test_an_approval_is_bound_to_the_invocation_id_and_digest_of_the_call(
    store: CheckpointStore,
) -> None:
    await _parked(store)
    await store.approve("j-1", invocation_id="j-1/0/1", digest="digest-prod")
    state = await store.request_approval("j-1", 1, DEPLOY)  # the same call again: no new park
    assert (state.status, state.decide(DEPLOY)) == ("RUNNING", "granted")
    # The same position with other arguments is another call: it parks and asks.
    other_args = ApprovalRequest("j-1/0/1", "digest-staging", "deploy", step=0, attempt=1)
    assert (await store.get_approval("j-1")).decide(other_args) == "unasked"  # type: ignore[union-attr]
    state = await store.request_approval("j-1", 1, other_args)
    assert (state.status, state.decide(other_args)) == ("WAITING_FOR_APPROVAL", "waiting")
    # ... and so is the same arguments at another position.
    later = ApprovalRequest("j-1/1/0", "digest-prod", "deploy", step=1, attempt=1)
    assert state.decide(later) == "unasked"
    assert [g["invocation_id"] for g in state.grants] == ["j-1/0/1"]
    assert state.grants[0]["digest"] == "digest-prod" and state.grants[0]["approved_at"] > 0


async def test_approve_refuses_a_call_other_than_the_one_named(store: CheckpointStore) -> None:
    await _parked(store)
    with pytest.raises(JobStateConflict, match=r"waits for deploy \(j-1/0/1, digest digest-prod\)"):
        await store.approve("j-1", invocation_id="j-1/0/2")
    with pytest.raises(JobStateConflict, match="not the call named"):
        await store.approve("j-1", invocation_id="j-1/0/1", digest="digest-staging")
    state = await store.get_approval("j-1")
    assert state is not None and state.status == "WAITING_FOR_APPROVAL" and state.grants == ()


async def test_approve_of_no_call_refuses_a_job_that_records_one(store: CheckpointStore) -> None:
    # ``no_call``: the operator was shown no call (a row parked without a readable request); one recorded
    # since is refused, in the same transaction as the approval, never granted unseen.
    await _parked(store)
    with pytest.raises(
        JobStateConflict, match=r"now waits for deploy \(j-1/0/1\), a call that was not shown"
    ):
        await store.approve("j-1", no_call=True)
    state = await store.get_approval("j-1")
    assert state is not None and state.status == "WAITING_FOR_APPROVAL" and state.grants == ()


async def test_approve_makes_the_row_pending_when_the_parked_process_is_gone(
    store: CheckpointStore, backend: Backend
) -> None:
    # Killed while parked (same pid namespace, so its pid can be judged): nobody would take a RUNNING row,
    # so the approval makes the job runnable, and the grant waits on the row for whoever resumes it.
    await _parked(store)
    await _set(backend, "j-1", owner=_exited_owner(), heartbeat_at=time.time())
    approved = await store.approve("j-1")
    assert (approved.status, approved.attempt) == ("PENDING", 1)
    claimed = await store.claim_next()
    assert claimed is not None and claimed.attempt == 2
    assert (await store.request_approval("j-1", 2, DEPLOY)).decide(DEPLOY) == "granted"


@pytest.mark.parametrize(
    ("owner", "heartbeat_age", "status"),
    [
        ("another-host:7:1:0a0b0c0d:b-1.1", 5.0, "RUNNING"),  # cannot be judged: its heartbeat is fresh
        (
            "another-host:7:1:0a0b0c0d:b-1.1",
            THRESHOLD + 60,
            "PENDING",
        ),  # silent for longer than the threshold
        (None, 5.0, "PENDING"),  # the process parked, exited and let go of the row
    ],
)
async def test_approve_hands_a_running_row_only_to_an_owner_that_may_be_alive(
    store: CheckpointStore, backend: Backend, owner: str | None, heartbeat_age: float, status: str
) -> None:
    await _parked(store)
    await _set(backend, "j-1", owner=owner, heartbeat_at=time.time() - heartbeat_age)
    assert (await store.approve("j-1")).status == status


async def test_a_rejection_is_final_and_a_retry_asks_again(store: CheckpointStore) -> None:
    await _parked(store)
    rejected = await store.reject("j-1", "not in prod")
    assert rejected.status == "FAILED"
    entry = rejected.error[-1]
    assert (entry["error_class"], entry["invocation_id"], entry["tool"]) == (
        "ApprovalRejected",
        "j-1/0/1",
        "deploy",
    )
    # The process that asked sees a refusal, whatever it asks next; its writes cannot revive the row.
    state = await store.request_approval("j-1", 1, DEPLOY)
    assert (state.status, state.decide(DEPLOY)) == ("FAILED", "refused")
    assert state.rejection is not None and state.rejection["reason"] == "not in prod"
    with pytest.raises(AttemptFenced, match="the row is FAILED"):
        await store.set_status("j-1", 1, "RUNNING")
    with pytest.raises(JobStateConflict, match="cannot approve job j-1: it is FAILED"):
        await store.approve("j-1")
    # A retry runs the job again; it grants nothing: the call parks and asks again.
    retried = await store.retry("j-1")
    assert retried.status == "PENDING"
    claimed = await store.claim_next()
    assert claimed is not None and claimed.attempt == 2
    fresh = await store.get_approval("j-1")
    assert fresh is not None and (fresh.request, fresh.rejection, fresh.grants) == (None, None, ())
    assert fresh.decide(DEPLOY) == "unasked"
    asked = await store.request_approval("j-1", 2, DEPLOY)
    assert (asked.status, asked.decide(DEPLOY)) == ("WAITING_FOR_APPROVAL", "waiting")


async def test_no_order_of_operations_turns_a_rejection_into_an_approval(make_store: StoreFactory) -> None:
    # Every sequence of up to four operator commands after a rejection, from two connections: the rejected
    # call is never granted, and only an approve given while it is parked again can grant it.
    import itertools

    first, second = await make_store(), await make_store()
    operations = ("approve", "reject", "cancel", "retry")
    for n, sequence in enumerate(itertools.product(operations, repeat=3)):
        job_id = f"seq-{n}"
        request = ApprovalRequest(f"{job_id}/0/0", "d", "deploy")
        await first.create_job(job_id, "agent-a", None)
        await first.claim(job_id, 1)
        await first.request_approval(job_id, 1, request)
        await first.reject(job_id, "no")
        for i, name in enumerate(sequence):
            store = (first, second)[i % 2]
            operation = getattr(store, name)
            with contextlib.suppress(JobStateConflict):
                await (operation(job_id) if name in ("approve", "retry") else operation(job_id, "op"))
        state = await first.get_approval(job_id)
        assert state is not None and not state.granted(request), sequence


async def test_approval_requests_are_fenced_like_every_write(make_store: StoreFactory) -> None:
    mine, other = await make_store(), await make_store()
    await _create(mine, "j-1")
    await mine.claim("j-1", 1)
    with pytest.raises(AttemptFenced):
        await other.request_approval("j-1", 1, DEPLOY)  # same attempt, another live claim token
    with pytest.raises(AttemptFenced):
        await mine.request_approval("j-1", 0, DEPLOY)
    assert (await mine.get_approval("j-1")).status == "RUNNING"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "column",
    [
        "x",
        [1, 2],
        {"grants": "all"},
        {"grants": [{"invocation_id": "j-1/0/1"}], "request": 5},  # no digest: approves nothing
        {"grants": [{"invocation_id": "j-1/0/1", "digest": ["digest-prod"]}]},
        {"grants": [None, {"invocation_id": 1, "digest": "digest-prod"}], "rejection": "nope"},
    ],
)
async def test_an_approval_record_written_badly_approves_nothing(
    store: CheckpointStore, backend: Backend, column: Any
) -> None:
    await _create(store, "j-1")
    await store.claim("j-1", 1)
    await _set(backend, "j-1", approval=column)
    state = await store.get_approval("j-1")
    assert state is not None and state.grants == () and state.decide(DEPLOY) == "unasked"
    asked = await store.request_approval("j-1", 1, DEPLOY)  # asks, and the row becomes readable again
    assert asked.decide(DEPLOY) == "waiting"
    approved = await store.approve("j-1")
    assert approved.status == "RUNNING"
    assert (await store.request_approval("j-1", 1, DEPLOY)).decide(DEPLOY) == "granted"


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_ENTRY = st.fixed_dictionaries(
    {
        "invocation_id": st.sampled_from(["j-1/0/1", "j-1/0/2", 1, None]),
        "digest": st.sampled_from(["d", "e", ["d"]]),
    }
)


@settings(max_examples=300, deadline=None)
@given(
    raw=_JSON
    | st.fixed_dictionaries({"grants": st.lists(_ENTRY | _JSON, max_size=4)}, optional={"request": _JSON})
)
def test_any_approval_record_grants_exactly_the_calls_it_names(raw: Any) -> None:
    # Whatever a hand, an older version or a torn write left in the column: reading it never fails, and it
    # grants a call only when a grant names that call's invocation id and digest, both as strings.
    from agentlife.stores import ApprovalState

    request = ApprovalRequest("j-1/0/1", "d", "deploy")
    state = ApprovalState.from_column("WAITING_FOR_APPROVAL", raw)
    grants = raw.get("grants") if isinstance(raw, dict) else None
    named = isinstance(grants, list) and any(
        isinstance(g, dict) and g.get("invocation_id") == "j-1/0/1" and g.get("digest") == "d" for g in grants
    )
    assert state.granted(request) is named
    assert state.decide(request) in ("granted", "waiting", "unasked")


async def test_an_approval_column_that_is_not_json_reads_as_empty_on_sqlite(tmp_path: Path) -> None:
    from agentlife.stores import SQLiteStore

    store = SQLiteStore(tmp_path / "a.db")
    await store.open()
    try:
        await _create(store, "j-1")
        await store.claim("j-1", 1)
        conn = sqlite3.connect(tmp_path / "a.db", isolation_level=None)
        conn.execute("UPDATE job SET approval = '{\"grants\": [tor' WHERE id = 'j-1'")
        conn.close()
        state = await store.get_approval("j-1")
        assert state is not None and state.grants == ()
        assert (await store.request_approval("j-1", 1, DEPLOY)).decide(DEPLOY) == "waiting"
    finally:
        await store.close()


@pytest.mark.parametrize("status", ["PENDING", "RUNNING", "COMPLETED", "FAILED"])
async def test_approve_of_a_job_that_is_not_parked_names_its_status(
    store: CheckpointStore, backend: Backend, status: str
) -> None:
    await _create(store, "j-1")
    await _set(backend, "j-1", status=status)
    with pytest.raises(JobStateConflict, match=f"cannot approve job j-1: it is {status}"):
        await store.approve("j-1")
    assert (await store.get_job("j-1")).status == status


async def test_operations_on_an_unknown_job_raise_job_not_found(store: CheckpointStore) -> None:
    for operation in (
        store.approve("ghost"),
        store.reject("ghost", "no"),
        store.cancel("ghost", "no"),
        store.retry("ghost"),
    ):
        with pytest.raises(JobNotFound, match="ghost"):
            await operation


async def test_reject_fails_the_parked_job_and_records_why(store: CheckpointStore, backend: Backend) -> None:
    await _create(store, "j-1")
    await _set(backend, "j-1", status="WAITING_FOR_APPROVAL", attempt=2)
    rejected = await store.reject("j-1", "too risky")
    assert rejected.status == "FAILED"
    entry = rejected.error[-1]
    assert (entry["error_class"], entry["message"], entry["attempt"], entry["exit_code"]) == (
        "ApprovalRejected",
        "too risky",
        2,
        0,
    )
    with pytest.raises(JobStateConflict, match="it is FAILED"):
        await store.reject("j-1", "again")


async def test_cancel_fences_out_the_process_running_the_job(store: CheckpointStore) -> None:
    await _create(store, "j-1")
    claimed = await store.claim_next()
    assert claimed is not None
    cancelled = await store.cancel("j-1", "not needed")
    assert (cancelled.status, cancelled.attempt) == ("FAILED", 2)
    assert cancelled.error[-1]["error_class"] == "Cancelled"
    with pytest.raises(AttemptFenced):
        await store.write_checkpoint("j-1", 1, "cp-1", 1, b"late")
    with pytest.raises(AttemptFenced):
        await store.heartbeat("j-1", 1)
    assert (await store.get_job("j-1")).checkpoint_id is None
    with pytest.raises(JobStateConflict, match="cannot cancel job j-1: it is FAILED"):
        await store.cancel("j-1", "twice")


async def test_retry_makes_a_dead_letter_runnable_and_forgives_earlier_crashes(
    store: CheckpointStore, backend: Backend
) -> None:
    await _create(store, "j-1")
    crashes = [{"at": 1.0, "attempt": n, "exit_code": 1, "error_class": "E", "message": "m"} for n in (1, 2)]
    await _set(backend, "j-1", status="DEAD_LETTER", attempt=5, error=crashes, not_before=time.time() + 999)
    retried = await store.retry("j-1")
    assert (retried.status, retried.attempt) == ("PENDING", 5)
    assert retried.error[-1]["event"] == "retry"
    claimed = await store.claim_next()
    assert claimed is not None and (claimed.id, claimed.attempt) == ("j-1", 6)
    await _set(backend, "j-1", status="COMPLETED")
    with pytest.raises(JobStateConflict, match="cannot retry job j-1: it is COMPLETED"):
        await store.retry("j-1")


async def _race(
    make_store: StoreFactory, backend: Backend, status: str, left: str, right: str
) -> dict[str, list[str]]:
    """Run operations ``left`` and ``right`` at once, on two connections, on each of 20 rows."""
    first, second = await make_store(), await make_store()
    ids = [f"race-{i}" for i in range(20)]
    await _create(first, *ids)
    for job_id in ids:
        await _set(backend, job_id, status=status)
    winners: dict[str, list[str]] = {job_id: [] for job_id in ids}

    async def run(store: CheckpointStore, job_id: str, name: str) -> None:
        operation = getattr(store, name)
        try:
            await (operation(job_id) if name in ("approve", "retry") else operation(job_id, "race"))
        except JobStateConflict as exc:
            if f"cannot {name} job {job_id}: it is" not in str(exc):
                raise
            return
        winners[job_id].append(name)

    async with anyio.create_task_group() as tg:
        for job_id in ids:
            tg.start_soon(run, first, job_id, left)
            tg.start_soon(run, second, job_id, right)
    return winners


@pytest.mark.parametrize(("left", "right"), [("approve", "reject"), ("retry", "retry")])
async def test_concurrent_operations_needing_the_same_status_exactly_one_wins(
    make_store: StoreFactory, backend: Backend, left: str, right: str
) -> None:
    status = "WAITING_FOR_APPROVAL" if left == "approve" else "DEAD_LETTER"
    for job_id, names in (await _race(make_store, backend, status, left, right)).items():
        assert len(names) == 1, (job_id, names)


async def test_concurrent_approve_and_cancel_end_as_one_of_them_serially(
    make_store: StoreFactory, backend: Backend
) -> None:
    # Cancel is allowed on a PENDING job, so "approve, then cancel" may both win; "cancel, then approve"
    # may not: the approval of a cancelled job must fail, naming FAILED.
    store = await make_store()
    outcomes = await _race(make_store, backend, "WAITING_FOR_APPROVAL", "approve", "cancel")
    for job_id, names in outcomes.items():
        assert "cancel" in names, (job_id, names)  # cancel never loses: it accepts both starting points
        row = await store.get_job(job_id)
        assert (row.status, row.attempt) == ("FAILED", 1)


# -- the zombie reaper --------------------------------------------------------------------------------


async def test_reaper_moves_a_stale_running_row_to_retrying_with_backoff(store: CheckpointStore) -> None:
    await _create(store, "j-1", "j-fresh")
    await store.claim_next()
    await store.claim_next()
    now = time.time() + THRESHOLD + 60
    await store.heartbeat("j-fresh", 1)
    assert await store.reap(THRESHOLD, now=time.time()) == []  # nothing stale yet
    (decision, *rest) = await store.reap(THRESHOLD, now=now)
    assert isinstance(decision, ReapDecision)
    assert (decision.status, decision.attempt, decision.circuit_open) == ("RETRYING", 2, False)
    assert decision.not_before == pytest.approx(now + Constants().retry.crash_backoff_seconds[0])
    assert decision.heartbeat_age_seconds >= THRESHOLD
    row = await store.get_job(decision.job_id)
    assert (row.status, row.attempt) == ("RETRYING", 1)  # the next claim bumps it, once
    entry = row.error[-1]
    assert (entry["reason"], entry["attempt"], entry["at"], entry["decision"]) == (
        "heartbeat stale",
        1,
        pytest.approx(now),
        "RETRYING",
    )
    assert entry["heartbeat_at"] is not None and entry["not_before"] == pytest.approx(decision.not_before)
    assert len(rest) == 1  # j-fresh's heartbeat was also older than the simulated threshold


async def test_a_reaped_jobs_next_attempt_is_one_more_than_the_reaped_one(
    store: CheckpointStore, backend: Backend
) -> None:
    await _create(store, "j-1")
    claimed = await store.claim_next()
    assert claimed is not None and claimed.attempt == 1
    (decision,) = await store.reap(THRESHOLD, now=time.time() + THRESHOLD + 1)
    assert decision.attempt == 2
    await _set(backend, "j-1", not_before=time.time() - 1)  # past the backoff
    again = await store.claim_next()
    assert again is not None and (again.id, again.attempt) == ("j-1", 2)  # not 3: reaper and claim bumped
    # The next run of a control plane that starts attempts itself uses the row's attempt + 1 as well.
    await store.heartbeat("j-1", 2)


async def test_reaped_row_fences_out_the_dead_process_if_it_wakes_up(make_store: StoreFactory) -> None:
    zombie, reaper = await make_store(), await make_store()
    await _create(zombie, "j-1")
    claimed = await zombie.claim_next()
    assert claimed is not None
    await reaper.reap(THRESHOLD, now=time.time() + THRESHOLD + 1)
    with pytest.raises(AttemptFenced):
        await zombie.write_checkpoint("j-1", claimed.attempt, "cp-late", 1, b"late")
    with pytest.raises(AttemptFenced):
        await zombie.set_status("j-1", claimed.attempt, JobStatus.COMPLETED, result={"late": True})
    row = await reaper.get_job("j-1")
    assert (row.status, row.checkpoint_id, row.result) == ("RETRYING", None, None)


async def test_reaper_dead_letters_a_job_whose_crash_retries_are_exhausted(
    store: CheckpointStore, backend: Backend
) -> None:
    schedule = Constants().retry.crash_backoff_seconds
    crashes = [
        {"at": 1.0, "attempt": n, "exit_code": 1, "error_class": "E", "message": f"crash {n}"}
        for n in range(len(schedule))
    ]
    await _create(store, "j-1")
    await store.claim_next()
    await _set(backend, "j-1", error=crashes)
    (decision,) = await store.reap(THRESHOLD, now=time.time() + THRESHOLD + 1)
    assert (decision.status, decision.not_before) == ("DEAD_LETTER", None)
    assert "exhausted" in decision.reason
    row = await store.get_job("j-1")
    assert (row.status, row.error[-1]["decision"]) == ("DEAD_LETTER", "DEAD_LETTER")
    assert await store.claim_next() is None


async def test_reaper_fails_a_job_whose_token_budget_is_spent(
    store: CheckpointStore, backend: Backend
) -> None:
    await store.create_job("j-1", "agent-a", None, {"max_cost_usd": 1.0})
    await store.claim_next()
    await store.add_usage("j-1", 1, 10, 10, 1.5)
    (decision,) = await store.reap(THRESHOLD, now=time.time() + THRESHOLD + 1)
    assert decision.status == "FAILED" and "budget" in decision.reason


async def test_circuit_breaker_holds_the_retries_of_an_agent_that_keeps_crashing(
    store: CheckpointStore,
) -> None:
    budget = Constants().budget
    ids = [f"j-{i}" for i in range(budget.circuit_failure_threshold)]
    await _create(store, *ids, agent="flaky")
    await _create(store, "other-1", agent="steady")
    for _ in range(len(ids) + 1):
        await store.claim_next()
    now = time.time() + THRESHOLD + 1
    decisions = {d.job_id: d for d in await store.reap(THRESHOLD, now=now)}
    first = Constants().retry.crash_backoff_seconds[0]
    for job_id in ids[:-1]:
        assert decisions[job_id].not_before == pytest.approx(now + first)
        assert not decisions[job_id].circuit_open
    held = decisions[ids[-1]]
    assert held.circuit_open and held.status == "RETRYING"
    assert held.not_before == pytest.approx(now + budget.circuit_cooldown_seconds)
    assert "circuit breaker open for agent flaky" in held.reason
    assert not decisions["other-1"].circuit_open  # another agent's crashes do not count


async def test_two_reapers_at_once_act_on_each_row_once(make_store: StoreFactory) -> None:
    first, second = await make_store(), await make_store()
    ids = [f"j-{i:02d}" for i in range(12)]
    await _create(first, *ids)
    for _ in ids:
        await first.claim_next()
    now = time.time() + THRESHOLD + 1
    results: list[list[ReapDecision]] = [[], []]

    async def reap(index: int, reaper: CheckpointStore) -> None:
        results[index] = await reaper.reap(THRESHOLD, now=now)

    async with anyio.create_task_group() as tg:
        tg.start_soon(reap, 0, first)
        tg.start_soon(reap, 1, second)
    acted = [d.job_id for r in results for d in r]
    assert sorted(acted) == ids
    for row in await first.list_jobs(limit=50):
        assert (row.status, row.attempt, len(row.error)) == ("RETRYING", 1, 1)


async def test_a_database_without_not_before_is_migrated_by_init_schema(
    store: CheckpointStore, backend: Backend
) -> None:
    t = backend.tables.job
    if backend.kind == "sqlite":
        for index in ("agent_due", "claim", "agent_claim"):
            await backend.raw(f"DROP INDEX {t}_{index}")
    await backend.raw(f"ALTER TABLE {t} DROP COLUMN not_before")
    await backend.raw(
        f"INSERT INTO {t} (id, agent_id, status, attempt, updated_at)"
        " VALUES ('old', 'agent-a', 'PENDING', 0, " + ("1.0)" if backend.kind == "sqlite" else "now())")
    )
    await store.init_schema()
    claimed = await store.claim_next()
    assert claimed is not None and (claimed.id, claimed.attempt) == ("old", 1)


def _exited_owner(namespace: str | None = None) -> str:
    """The claim token of a process of this host that has exited: ``host:pid:ticks:random:namespace``."""
    import socket
    import subprocess

    from agentlife.stores._base import _start_ticks, namespace_id

    gone = subprocess.Popen(["sleep", "30"])
    ticks = _start_ticks(gone.pid)
    gone.kill()
    gone.wait()
    return f"{socket.gethostname()}:{gone.pid}:{ticks}:0a0b0c0d:{namespace or namespace_id()}"


async def test_reaper_takes_back_rows_whose_claiming_process_on_this_host_exited(
    store: CheckpointStore, backend: Backend
) -> None:
    import socket

    await _create(store, "j-dead", "j-live", "j-elsewhere", "j-legacy")
    for _ in range(4):
        await store.claim_next()
    beat = Constants().heartbeat.job_interval_seconds
    await _set(backend, "j-dead", owner=_exited_owner(), heartbeat_at=time.time() - beat - 5)
    await _set(backend, "j-elsewhere", owner="another-host:1:1:0a0b0c0d:b-1.1")  # cannot be judged from here
    # A token of an older version names no pid namespace: the pid cannot be judged either.
    legacy = f"{socket.gethostname()}:999999999:1:0a0b0c0d"
    await _set(backend, "j-legacy", owner=legacy, heartbeat_at=time.time() - beat - 5)
    # Heartbeats younger than the threshold: the threshold alone reaps nothing.
    assert await store.reap(THRESHOLD) == []
    (decision,) = await store.reap(THRESHOLD, dead_owners=True)
    assert (decision.job_id, decision.status, decision.attempt) == ("j-dead", "RETRYING", 2)
    row = await store.get_job("j-dead")
    assert (row.status, row.error[-1]["error_class"], row.error[-1]["reason"]) == (
        "RETRYING",
        "OwnerGone",
        "claiming process gone",
    )
    for alive in ("j-live", "j-elsewhere", "j-legacy"):  # j-live's owner is this process
        assert (await store.get_job(alive)).status == "RUNNING"
    assert await store.reap(THRESHOLD, dead_owners=True) == []  # once


@settings(max_examples=300, deadline=None)
@given(pid=st.text(max_size=12), ticks=st.text(max_size=8), rest=st.text(max_size=30))
def test_an_owner_token_written_badly_is_judged_without_error(pid: str, ticks: str, rest: str) -> None:
    # The owner column is text anyone may write: no token makes the judge raise (a reaper pass or a claim
    # would die with it); only a token of this very namespace with a well-formed pid can be called gone.
    import socket

    from agentlife.stores._base import claim_refusal, namespace_id, owner_is_gone, owner_is_live

    ours = f"{socket.gethostname()}:{pid}:{ticks}:0a0b0c0d:{namespace_id()}"
    for owner in (ours, rest, f"{socket.gethostname()}:{pid}:{ticks}:{rest}"):
        gone = owner_is_gone(owner)
        assert isinstance(owner_is_live(owner, 1.0, 300.0), bool)
        claim_refusal("j", 1, 1, owner, "me", 1.0)
        if gone:
            assert owner == ours and pid.isascii() and pid.isdigit() and ticks not in ("", "-")


async def test_a_fresh_heartbeat_wins_over_the_dead_owner_check(
    store: CheckpointStore, backend: Backend
) -> None:
    # A container sharing this host name in another pid namespace (hostNetwork, compose's hostname:): its
    # pid is not visible here, yet its process runs and beats. Neither its token nor its age may reap it.
    import uuid

    await _create(store, "j-other-ns", "j-just-died")
    for _ in range(2):
        await store.claim_next()
    other = f"{uuid.uuid4()}.4026531836"  # another boot id (another machine's, or a reboot's)
    await _set(backend, "j-other-ns", owner=_exited_owner(other), heartbeat_at=time.time() - 0.7)
    # Same namespace, its pid gone, but the heartbeat 0.7 s old: a fresh heartbeat always wins.
    await _set(backend, "j-just-died", owner=_exited_owner(), heartbeat_at=time.time() - 0.7)
    assert await store.reap(THRESHOLD, dead_owners=True) == []
    for job_id in ("j-other-ns", "j-just-died"):
        row = await store.get_job(job_id)
        assert (row.status, row.attempt, row.error) == ("RUNNING", 1, [])
    # Once it missed a heartbeat interval, the owner proven gone in this namespace is reaped; the other not.
    beat = Constants().heartbeat.job_interval_seconds
    for job_id in ("j-other-ns", "j-just-died"):
        await _set(backend, job_id, heartbeat_at=time.time() - beat - 1)
    assert [d.job_id for d in await store.reap(THRESHOLD, dead_owners=True)] == ["j-just-died"]
    assert (await store.get_job("j-other-ns")).status == "RUNNING"


async def test_drop_claim_clears_only_this_stores_token(make_store: StoreFactory, backend: Backend) -> None:
    mine, theirs = await make_store(), await make_store()
    await _create(mine, "j-mine", "j-theirs")
    await mine.claim_next()
    await theirs.claim_next()
    await mine.drop_claim("j-theirs")  # not ours: left alone
    await mine.drop_claim("j-mine")
    owners = {
        job_id: (await backend.raw(f"SELECT owner FROM {backend.tables.job} WHERE id = $1", job_id))[0][0]
        for job_id in ("j-mine", "j-theirs")
    }
    assert owners["j-mine"] is None and owners["j-theirs"] is not None
    assert (await mine.get_job("j-mine")).status == "RUNNING"  # the status is not the claim's business


async def test_an_event_is_taken_by_exactly_one_wait_and_again_by_the_same_one(
    store: CheckpointStore,
) -> None:
    await _create(store, "j-1")
    row = await store.claim_next()
    assert row is not None
    first = await store.send_event("j-1", "answer", {"n": 1})
    second = await store.send_event("j-1", "answer", {"n": 2})
    assert second > first
    assert await store.take_event("j-1", row.attempt, ["other"], "j-1/0/0") is None
    assert await store.take_event("j-1", row.attempt, ["answer"], "j-1/0/1") == ("answer", {"n": 1})
    # Asked again after a crash, the same wait gets the same event; the next wait gets the next one.
    assert await store.take_event("j-1", row.attempt, ["answer"], "j-1/0/1") == ("answer", {"n": 1})
    assert await store.take_event("j-1", row.attempt, ["answer"], "j-1/0/2") == ("answer", {"n": 2})
    assert await store.take_event("j-1", row.attempt, ["answer"], "j-1/0/3") is None
    with pytest.raises(AttemptFenced):
        await store.take_event("j-1", row.attempt - 1, ["answer"], "j-1/0/3")


async def test_an_event_wakes_a_job_parked_for_it_and_one_sent_while_it_parks(store: CheckpointStore) -> None:
    await _create(store, "j-1", "j-2")
    for _ in ("j-1", "j-2"):
        row = await store.claim_next()
        assert row is not None
        if row.id == "j-2":  # sent while the job was still running: the park finds it and is due at once
            await store.send_event("j-2", "answer")
        far = time.time() + 3600
        assert await store.park_waiting(row.id, row.attempt, far, {"kind": "event", "events": ["answer"]})
    resumed = await store.claim_next()
    assert resumed is not None and resumed.id == "j-2"
    assert await store.claim_next() is None
    await store.send_event("j-1", "unasked")  # kept, but wakes nothing
    assert await store.claim_next() is None
    await store.send_event("j-1", "answer")
    woken = await store.claim_next()
    assert woken is not None and woken.id == "j-1"


async def test_an_event_for_an_unknown_or_finished_job_is_refused(store: CheckpointStore) -> None:
    with pytest.raises(JobNotFound):
        await store.send_event("nope", "answer")
    await _create(store, "j-1")
    await store.cancel("j-1", "no")
    with pytest.raises(JobStateConflict, match="it is FAILED"):
        await store.send_event("j-1", "answer")
    with pytest.raises(ConfigError, match="not JSON"):
        await store.send_event("j-1", "answer", {1, 2})


async def _race_to_create(stores: list[CheckpointStore], job_id: str) -> dict[int, str]:
    """Each store creates ``job_id`` exclusively, all at once: who was told what."""
    outcomes: dict[int, str] = {}

    async def create(n: int) -> None:
        try:
            await stores[n].create_job(job_id, "agent", {"who": n}, exclusive=True)
            outcomes[n] = "created"
        except JobStateConflict as exc:
            outcomes[n] = str(exc)

    async with anyio.create_task_group() as tasks:
        for n in range(len(stores)):
            tasks.start_soon(create, n)
    return outcomes


async def test_of_exclusive_creates_racing_for_one_id_exactly_one_wins(make_store: StoreFactory) -> None:
    # `job create --job-id` from several places at once (a retried request, two operators): the insert itself
    # decides, so exactly one is told it created the job, and the row holds that one's payload.
    stores = [await make_store() for _ in range(4)]
    for round_ in range(6):
        outcomes = await _race_to_create(stores, f"race-{round_}")
        [winner] = [n for n, outcome in outcomes.items() if outcome == "created"]
        assert set(outcomes.values()) == {
            "created",
            f"job race-{round_} already exists (PENDING, agent agent)",
        }
        row = await stores[0].get_job(f"race-{round_}")
        assert row is not None and row.payload == {"who": winner}
    assert (await stores[0].create_job("race-0", "agent", None)).payload is not None  # not exclusive: the row


# -- who did it ----------------------------------------------------------------------------------------------


async def test_each_operator_transition_records_its_actor_and_time(store: CheckpointStore) -> None:
    await _parked(store)
    before = time.time()
    approved = await store.approve("j-1", invocation_id="j-1/0/1", actor="alice@laptop")
    state = await store.get_approval("j-1")
    assert state is not None and state.grants[-1]["approved_by"] == "alice@laptop"
    assert state.grants[-1]["approved_at"] >= before - 1
    await store.set_status("j-1", approved.attempt, JobStatus.RUNNING)
    state = await store.request_approval("j-1", 1, ApprovalRequest("j-1/0/2", "d2", "rm", step=0, attempt=1))
    rejected = await store.reject("j-1", "no", actor="bob")
    assert state.status == "WAITING_FOR_APPROVAL" and rejected.error[-1]["actor"] == "bob"
    fresh = await store.get_approval("j-1")
    assert fresh is not None and fresh.rejection is not None and fresh.rejection["rejected_by"] == "bob"
    retried = await store.retry("j-1", actor="carol (on call)")
    assert (retried.error[-1]["event"], retried.error[-1]["actor"]) == ("retry", "carol (on call)")
    cancelled = await store.cancel("j-1", "enough", actor="dave@host")
    entry = cancelled.error[-1]
    assert (entry["error_class"], entry["actor"], entry["message"]) == ("Cancelled", "dave@host", "enough")
    assert entry["at"] >= before - 1
    # Read back by another client: the actor is in the stored history, not only in the returned row.
    row = await store.get_job("j-1")
    assert row is not None and [e.get("actor") for e in row.error] == ["bob", "carol (on call)", "dave@host"]
