"""Instant pickup on PostgreSQL: `PostgresStore.wait_for_work` on a real server, woken by ``NOTIFY`` from the
writes that make a job runnable; killed and refused LISTEN connections; schemas that must not cross-wake."""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import asyncpg
import pytest

from _pg import PostgresServer
from agentlife.stores import ApprovalRequest, JobStatus, PostgresStore, SQLiteStore, TableNames

pytestmark = pytest.mark.anyio

AGENT = "notify-agent"
LONG = 30.0  # a wait no test should reach: True before it can only come from a notification


async def _open(url: str, **kwargs: Any) -> PostgresStore:
    store = PostgresStore(url, **kwargs)
    await store.open()
    await store.init_schema()
    return store


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[PostgresStore]:
    s = await _open(postgres_url)
    try:
        yield s
    finally:
        await s.close()


async def _listening(store: PostgresStore, agent: str = AGENT) -> None:
    """The first wait opens the LISTEN connection and returns True at once (it may have missed work)."""
    assert await store.wait_for_work(agent, LONG) is True
    assert store._signal._listener.listening


async def _woken_by(
    store: PostgresStore, action: Callable[[], Awaitable[object]], agent: str = AGENT, timeout: float = LONG
) -> tuple[bool, float]:
    """Start waiting, run ``action`` from elsewhere, return (what the wait returned, seconds it took)."""
    result: list[bool] = []

    async def wait() -> None:
        result.append(await store.wait_for_work(agent, timeout))

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.sleep(0.05)  # the waiter is parked on its event
        await action()
    return result[0], time.monotonic() - started


async def _listen_pids(url: str) -> list[int]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND pid <> pg_backend_pid()"
        )
    finally:
        await conn.close()
    return [r[0] for r in rows]


async def _terminate(url: str, pids: list[int]) -> None:
    conn = await asyncpg.connect(url)
    try:
        for pid in pids:
            await conn.execute("SELECT pg_terminate_backend($1)", pid)
    finally:
        await conn.close()


# -- wake-ups -----------------------------------------------------------------------------------------


async def test_a_notification_wakes_only_the_waiters_of_its_agent(postgres_url: str) -> None:
    mine, other = await _open(postgres_url), await _open(postgres_url)
    try:
        await _listening(mine, "a")
        await _listening(other, "b")
        results: dict[str, bool] = {}

        async def wait(s: PostgresStore, agent: str, timeout: float) -> None:
            results[agent] = await s.wait_for_work(agent, timeout)

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, mine, "a", LONG)
            tg.start_soon(wait, other, "b", 1.0)
            await anyio.sleep(0.05)
            await mine.create_job("for-a", "a", None)
        assert results == {"a": True, "b": False}
        # Agent b's store heard the notification for a and kept nothing for b.
        assert await other.wait_for_work("b", 0.2) is False
    finally:
        await mine.close()
        await other.close()


async def test_a_notification_while_nobody_waits_is_kept_for_the_next_wait(store: PostgresStore) -> None:
    await _listening(store)
    await store.create_job("while-busy", AGENT, None)
    await anyio.sleep(0.2)  # delivered to the connection while the worker ran a job
    with anyio.fail_after(LONG / 2):
        assert await store.wait_for_work(AGENT, LONG) is True
    assert await store.wait_for_work(AGENT, 0.2) is False  # consumed: nothing more was made runnable


async def test_creating_an_existing_job_wakes_nobody(store: PostgresStore) -> None:
    await store.create_job("once", AGENT, None)
    await _listening(store)
    await store.create_job("once", AGENT, {"other": "payload"})  # ON CONFLICT DO NOTHING: no insert
    assert await store.wait_for_work(AGENT, 0.5) is False


async def test_an_agent_id_too_long_for_a_payload_still_creates_and_wakes_every_waiter(
    store: PostgresStore,
) -> None:
    await _listening(store)
    huge = "x" * 9000  # PostgreSQL refuses payloads of 8000 bytes and more
    woken, _ = await _woken_by(store, lambda: store.create_job("huge", huge, None))
    assert woken is True
    assert (await store.get_job("huge")) is not None


async def test_release_to_pending_and_retry_wake_a_delayed_retry_does_not(store: PostgresStore) -> None:
    await store.create_job("r", AGENT, None)
    row = await store.claim_next(AGENT)
    assert row is not None
    await _listening(store)
    woken, _ = await _woken_by(store, lambda: store.release("r", row.attempt, JobStatus.PENDING))
    assert woken is True

    row = await store.claim_next(AGENT)
    assert row is not None
    await store.release("r", row.attempt, JobStatus.RETRYING, delay_seconds=60.0)
    # Not runnable for a minute: no notification (the fallback poll finds it once the backoff is over).
    assert await store.wait_for_work(AGENT, 0.5) is False

    await store.cancel("r", "stop")
    woken, _ = await _woken_by(store, lambda: store.retry("r"))
    assert woken is True
    assert (await store.get_job("r")).status == JobStatus.PENDING  # type: ignore[union-attr]


async def test_a_wait_ends_when_a_timer_of_its_agent_comes_due(store: PostgresStore) -> None:
    """No statement notifies a backoff's end: the wait itself is bounded by the agent's next due row."""
    await store.create_job("t", AGENT, None)
    row = await store.claim_next(AGENT)
    assert row is not None
    await store.release("t", row.attempt, JobStatus.RETRYING, delay_seconds=0.5)
    await _listening(store)
    assert await store.wait_for_work(AGENT, LONG) is True  # at the backoff's end, not at LONG
    assert (await store.claim_next(AGENT)) is not None  # and the row is claimable then
    assert await store.wait_for_work("another-agent", 0.3) is False  # another agent's timer wakes nobody


def _count_statements(store: PostgresStore) -> list[int]:
    """Count the pooled connections the store takes from now on (each job operation takes one)."""
    taken = [0]
    ops = store._db._ops

    def counted() -> Any:
        taken[0] += 1
        return ops()

    store._db._ops = counted  # type: ignore[method-assign]
    return taken


async def test_an_idle_claim_tells_the_wait_when_the_next_timer_is_due(store: PostgresStore) -> None:
    """The claim that finds nothing brings the next due time back: the idle wait asks nothing more."""
    await store.create_job("h", AGENT, None)
    row = await store.claim_next(AGENT)
    assert row is not None
    await store.release("h", row.attempt, JobStatus.RETRYING, delay_seconds=0.5)
    await _listening(store)
    taken = _count_statements(store)
    assert await store.claim_next(AGENT) is None  # backing off: nothing to claim, its due time learnt
    assert taken == [1]
    assert await store.wait_for_work(AGENT, LONG) is True  # woken at the backoff's end, not at LONG
    assert taken == [1]  # the wait ran no statement of its own
    assert (await store.claim_next(AGENT)) is not None


async def test_a_due_time_learnt_for_another_agent_is_asked_again(
    store: PostgresStore, postgres_url: str
) -> None:
    other = await _open(postgres_url)
    try:
        await _listening(store)
        assert await store.claim_next("another-agent") is None  # learns only of another agent's rows
        await other.create_job("g", AGENT, None)
        row = await other.claim_next(AGENT)
        assert row is not None
        await other.release("g", row.attempt, JobStatus.RETRYING, delay_seconds=0.3)
        taken = _count_statements(store)
        assert await store.wait_for_work(AGENT, LONG) is True
        assert taken == [1]  # asked the server
    finally:
        await other.close()


async def test_a_due_time_learnt_too_long_ago_is_asked_again(store: PostgresStore, postgres_url: str) -> None:
    await _listening(store)
    assert await store.claim_next(AGENT) is None  # nothing runnable and nothing due later: learnt
    await anyio.sleep(0.6)  # too long ago to stand for now
    conn = await asyncpg.connect(postgres_url)
    try:  # a row another client wrote, with no notification: only asking the server finds its timer
        await conn.execute(
            "INSERT INTO job (id, agent_id, status, attempt, updated_at, not_before)"
            " VALUES ('late', $1, 'RETRYING', 1, now(), now() + interval '0.3 seconds')",
            AGENT,
        )
    finally:
        await conn.close()
    # Trusting the stale "nothing due" would sleep the whole 10 s and return False.
    assert await store.wait_for_work(AGENT, 10.0) is True
    assert (await store.claim_next(AGENT)) is not None


async def test_a_row_parked_until_infinity_by_another_client_stops_no_claim_and_no_wait(
    store: PostgresStore, postgres_url: str
) -> None:
    """PostgreSQL keeps 'infinity' as a timestamp, and cannot subtract it: the claim's next-due time must
    not fail on it, or one row written by a control plane would fail every idle claim of its agent."""
    await _listening(store)
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(
            "INSERT INTO job (id, agent_id, status, attempt, updated_at, not_before)"
            " VALUES ('forever', $1, 'WAITING', 1, now(), 'infinity')",
            AGENT,
        )
    finally:
        await conn.close()
    assert await store.claim_next(AGENT) is None  # nothing runnable: no error either
    assert await store.wait_for_work(AGENT, 0.3) is False  # its timer never comes due
    store._signal._due_hint = None
    assert await store.wait_for_work(AGENT, 0.3) is False  # asked of the server: the same answer
    await store.create_job("now", AGENT, None)
    row = await store.claim_next(AGENT)
    assert row is not None and row.id == "now"


async def test_an_approval_that_leaves_the_row_pending_wakes_the_workers(
    store: PostgresStore, postgres_url: str
) -> None:
    await store.create_job("ap", AGENT, None)
    row = await store.claim_next(AGENT)
    assert row is not None
    request = ApprovalRequest(invocation_id="ap/0/0", digest="d", tool="t", step=0, attempt=row.attempt)
    await store.request_approval("ap", row.attempt, request)
    # The parking process is gone: its heartbeat is long stale, so the grant makes the row PENDING.
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute("UPDATE job SET heartbeat_at = $1 WHERE id = 'ap'", datetime.fromtimestamp(0, UTC))
    finally:
        await conn.close()
    await _listening(store)
    woken, _ = await _woken_by(store, lambda: store.approve("ap"))
    assert woken is True
    assert (await store.get_job("ap")).status == JobStatus.PENDING  # type: ignore[union-attr]


async def test_a_reaped_row_wakes_workers_only_once_its_backoff_is_over(store: PostgresStore) -> None:
    from agentlife.constants import Constants, RetryConstants

    await store.create_job("z-later", AGENT, None)
    assert await store.claim_next(AGENT) is not None
    await _listening(store)
    await anyio.sleep(0.05)  # the heartbeat is now in the past
    # The default backoff (5 s before the first retry): RETRYING, not runnable yet, no notification.
    decisions = await store.reap(0.0, now=time.time(), constants=Constants())
    assert [(d.job_id, d.status) for d in decisions] == [("z-later", "RETRYING")]
    assert await store.wait_for_work(AGENT, 0.5) is False

    await store.create_job("z-now", AGENT, None)
    assert await store.wait_for_work(AGENT, LONG) is True
    assert (await store.claim_next(AGENT)).id == "z-now"  # type: ignore[union-attr]
    await anyio.sleep(0.05)
    immediate = Constants(retry=RetryConstants(crash_backoff_seconds=(0.0, 60.0)))
    reaped: list[Any] = []

    async def reap() -> None:
        reaped.extend(await store.reap(0.0, now=time.time(), constants=immediate))

    woken, _ = await _woken_by(store, reap, timeout=5.0)
    assert [(d.job_id, d.status) for d in reaped] == [("z-now", "RETRYING")], reaped
    assert woken is True


# -- the fallback ---------------------------------------------------------------------------------------


async def test_a_killed_listen_connection_never_raises_and_comes_back(
    store: PostgresStore, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agentlife.store")
    await _listening(store)
    pids = await _listen_pids(postgres_url)
    assert len(pids) == 1

    async def kill() -> None:
        await _terminate(postgres_url, pids)
        await anyio.sleep(0.2)
        await store.create_job("lost", AGENT, None)  # sent to nobody: the connection is gone

    woken, _ = await _woken_by(store, kill, timeout=1.5)
    assert woken is False  # slept out its timeout: the caller's fallback poll claims "lost"
    # A later wait connects again (the drop was over a second ago) and returns True at once, since
    # notifications were missed meanwhile.
    assert await store.wait_for_work(AGENT, LONG) is True
    woken, _ = await _woken_by(store, lambda: store.create_job("after", AGENT, None))
    assert woken is True
    password = urllib.parse.urlsplit(postgres_url).password
    assert password and password not in caplog.text
    lost = [r for r in caplog.records if "LISTEN connection lost" in r.getMessage()]
    assert len(lost) == 1
    assert "back" in caplog.text


async def test_a_stopped_server_makes_waits_sleep_then_they_listen_again(
    postgres_server: PostgresServer, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = await _open(postgres_url, connect_timeout=2.0)
    try:
        await anyio.to_thread.run_sync(postgres_server.stop)
        try:
            for _ in range(3):  # refused every time: logged once, never raised
                assert await store.wait_for_work(AGENT, 0.5) is False
                await anyio.sleep(0.6)
        finally:
            await anyio.to_thread.run_sync(postgres_server.start)
        await anyio.sleep(1.1)
        assert await store.wait_for_work(AGENT, LONG) is True
        woken, _ = await _woken_by(store, lambda: store.create_job("back", AGENT, None))
        assert woken is True
    finally:
        await store.close()
    password = urllib.parse.urlsplit(postgres_url).password
    assert password and password not in caplog.text
    assert len([r for r in caplog.records if "LISTEN unavailable" in r.getMessage()]) == 1


async def test_a_wait_cancelled_mid_connect_and_close_leave_no_session(postgres_url: str) -> None:
    store = await _open(postgres_url)
    with anyio.move_on_after(0.0):  # cancelled at its first await: the connect goes on in its own task
        await store.wait_for_work(AGENT, LONG)
    await store.close()
    assert await _listen_pids(postgres_url) == []
    # A closed store only sleeps: no connection is opened behind it.
    assert await store.wait_for_work(AGENT, 0.1) is False
    assert await _listen_pids(postgres_url) == []


async def test_listen_false_and_sqlite_only_sleep(postgres_url: str, tmp_path: Path) -> None:
    store = await _open(postgres_url, listen=False)
    try:
        assert store.notifies is False
        assert await store.wait_for_work(AGENT, 0.1) is False
        await store.create_job("quiet", AGENT, None)
        assert await _listen_pids(postgres_url) == []
    finally:
        await store.close()
    lite = SQLiteStore.from_url(f"sqlite:///{tmp_path / 'a.db'}")
    assert lite.notifies is False


# -- isolation -------------------------------------------------------------------------------------------


async def test_two_schemas_and_two_table_prefixes_never_cross_wake(postgres_server: PostgresServer) -> None:
    one, two = postgres_server.create_schema(), postgres_server.create_schema()  # same database, same "job"
    prefixed = TableNames(
        job="pfx_job", checkpoint_history="pfx_history", delivery="pfx_delivery", conversation="pfx_conv"
    )
    stores = [await _open(one), await _open(two), await _open(one, tables=prefixed)]
    try:
        assert len({s._signal._listener.channel for s in stores if await _prime(s)}) == 3
        results: list[bool] = []

        async def wait(s: PostgresStore) -> None:
            results.append(await s.wait_for_work(AGENT, 1.0))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, stores[0])
            tg.start_soon(wait, stores[2])
            await anyio.sleep(0.05)
            await stores[1].create_job("elsewhere", AGENT, None)
        assert results == [False, False]
        woken, _ = await _woken_by(stores[2], lambda: stores[2].create_job("mine", AGENT, None))
        assert woken is True
    finally:
        for s in stores:
            await s.close()


async def _prime(store: PostgresStore) -> bool:
    await _listening(store)
    return True


# -- a real worker process -------------------------------------------------------------------------------


async def test_a_control_plane_notify_with_an_empty_payload_wakes_every_agent(
    store: PostgresStore, postgres_url: str
) -> None:
    """The statement the docs give a control plane that inserts rows itself."""
    await _listening(store, "a")
    assert await store.wait_for_work("b", 0.05) is False  # b is an agent this store waits for too

    async def notify() -> None:
        conn = await asyncpg.connect(postgres_url)
        try:
            await conn.execute("SELECT pg_notify('agentlife_job_' || 'job'::regclass::oid, '')")
        finally:
            await conn.close()

    woken, _ = await _woken_by(store, notify, agent="a")
    assert woken is True
    with anyio.fail_after(LONG / 2):
        assert await store.wait_for_work("b", LONG) is True  # kept for b, which was not waiting then
