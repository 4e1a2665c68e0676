"""PostgresStore beyond the shared contract: outages, the pool, schemas, secrets (real PostgreSQL server)."""

from __future__ import annotations

import logging
import time
import urllib.parse

import anyio
import anyio.to_thread
import asyncpg
import pytest

from _pg import PostgresServer
from agentlife import AttemptFenced, ConfigError, StoreError, StoreUnavailable
from agentlife.stores import PostgresStore, TableNames, store_from_url

pytestmark = pytest.mark.anyio


def _password(url: str) -> str:
    password = urllib.parse.urlsplit(url).password
    assert password
    return password


async def _open(url: str, **kwargs: object) -> PostgresStore:
    store = PostgresStore(url, **kwargs)  # type: ignore[arg-type]
    await store.open()
    await store.init_schema()
    return store


async def test_open_retries_then_reports_unavailable_without_password(
    postgres_server: PostgresServer, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = PostgresStore(postgres_url, connect_tries=3, connect_backoff=0.2, connect_timeout=2.0)
    await anyio.to_thread.run_sync(postgres_server.stop)
    try:
        started = time.monotonic()
        with (
            caplog.at_level(logging.WARNING, logger="agentlife.store"),
            pytest.raises(StoreUnavailable) as info,
        ):
            await store.open()
        elapsed = time.monotonic() - started
    finally:
        await anyio.to_thread.run_sync(postgres_server.start)

    message = str(info.value)
    assert "unreachable after 3 tries" in message
    assert "\n" not in message
    assert _password(postgres_url) not in message
    assert f"127.0.0.1:{postgres_server.port}" in message
    assert elapsed >= 2 * 0.2  # two backoffs between three tries
    tries = [m for m in caplog.messages if "unreachable (try" in m]
    assert len(tries) == 3
    assert not any(_password(postgres_url) in m for m in caplog.messages)
    assert not store.has_free_connection()
    await store.close()  # safe after a failed open


async def test_wrong_password_fails_at_once_without_leaking_either_password(postgres_url: str) -> None:
    parts = urllib.parse.urlsplit(postgres_url)
    wrong = "not-the-password-42"
    url = postgres_url.replace(f":{parts.password}@", f":{wrong}@")
    store = PostgresStore(url, connect_tries=3, connect_backoff=5.0)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="password authentication failed") as info:
        await store.open()
    assert time.monotonic() - started < 4.0  # no 5 s backoff: credentials do not heal
    assert wrong not in str(info.value)
    assert parts.password not in str(info.value)
    assert wrong not in repr(store)


async def test_missing_database_fails_at_once(postgres_server: PostgresServer) -> None:
    store = PostgresStore(postgres_server.url("no_such_db"), connect_backoff=5.0)
    with pytest.raises(StoreUnavailable, match="no_such_db"):
        await store.open()


async def test_bad_url_is_a_config_error() -> None:
    store = PostgresStore("postgresql://user:secret-pw@127.0.0.1:notaport/db")
    with pytest.raises(ConfigError) as info:
        await store.open()
    assert "secret-pw" not in str(info.value)


def test_invalid_pool_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="max_size"):
        PostgresStore("postgresql://localhost/db", min_size=5, max_size=2)
    with pytest.raises(ConfigError, match="connect_tries"):
        PostgresStore("postgresql://localhost/db", connect_tries=0)


async def test_missing_schema_says_to_run_db_init(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    await store.open()
    try:
        with pytest.raises(StoreUnavailable, match="agentlife db init"):
            await store.get_job("job-1")
    finally:
        await store.close()


async def test_create_schema_option_runs_init_schema_on_open(postgres_url: str) -> None:
    store = PostgresStore(postgres_url, create_schema=True)
    await store.open()
    try:
        await store.create_job("job-1", "agent", None)
        assert (await store.get_job("job-1")) is not None
    finally:
        await store.close()


async def test_server_stopped_mid_run_then_pool_recovers(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    store = await _open(postgres_url, command_timeout=5.0)
    try:
        await store.create_job("job-1", "agent", None)
        await store.claim("job-1", 1)
        await store.write_checkpoint("job-1", 1, "cp-1", 1, b"before")

        await anyio.to_thread.run_sync(postgres_server.stop)
        try:
            for operation in (
                store.write_checkpoint("job-1", 1, "cp-2", 2, b"during"),
                store.heartbeat("job-1", 1),
                store.get_job("job-1"),
                store.load_checkpoint("job-1"),
            ):
                with pytest.raises(StoreUnavailable) as info:
                    await operation
                assert _password(postgres_url) not in str(info.value)
        finally:
            await anyio.to_thread.run_sync(postgres_server.start)

        # The same store instance works again: the pool replaces its dead connections.
        await store.write_checkpoint("job-1", 1, "cp-3", 3, b"after")
        loaded = await store.load_checkpoint("job-1")
        assert (loaded.checkpoint_id, loaded.data) == ("cp-3", b"after")
        await store.heartbeat("job-1", 1)
        assert store.has_free_connection()
    finally:
        await store.close()


async def test_pool_exhaustion_clears_has_free_connection(postgres_url: str) -> None:
    store = await _open(postgres_url, min_size=1, max_size=2, command_timeout=10.0)
    blocker = await asyncpg.connect(postgres_url)
    try:
        await store.create_job("job-1", "agent", None)
        await store.claim("job-1", 1)
        # Hold the row lock so the store's heartbeats wait inside their pooled connections.
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute("SELECT 1 FROM job WHERE id = 'job-1' FOR UPDATE")
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(store.heartbeat, "job-1", 1)
            with anyio.fail_after(5):
                while store.has_free_connection():
                    await anyio.sleep(0.01)
            # Checked from another thread, as the probe server does.
            assert not await anyio.to_thread.run_sync(store.has_free_connection)
            await lock.rollback()
        assert store.has_free_connection()
        assert (await store.get_job("job-1")).heartbeat_at is not None
    finally:
        await blocker.close()
        await store.close()


async def test_waiting_for_a_pooled_connection_times_out_as_unavailable(postgres_url: str) -> None:
    store = await _open(postgres_url, min_size=1, max_size=1, command_timeout=0.3)
    blocker = await asyncpg.connect(postgres_url)
    try:
        await store.create_job("job-1", "agent", None)
        await store.claim("job-1", 1)
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute("SELECT 1 FROM job WHERE id = 'job-1' FOR UPDATE")
        with pytest.raises(StoreUnavailable, match="timed out"):
            await store.heartbeat("job-1", 1)
        await lock.rollback()
        await store.heartbeat("job-1", 1)  # the cancelled statement left the connection usable
    finally:
        await blocker.close()
        await store.close()


async def test_schema_qualified_table_names(postgres_url: str, postgres_server: PostgresServer) -> None:
    schema = f"cp_{time.monotonic_ns()}"
    tables = TableNames(
        job=f"{schema}.jobs", checkpoint_history=f"{schema}.history", delivery=f"{schema}.sent"
    )
    store = await _open(postgres_url, tables=tables)
    try:
        await store.create_job("job-1", "agent", {"x": 1})
        await store.claim("job-1", 1)
        await store.write_checkpoint("job-1", 1, "cp-1", 1, b"\x00data")
        await store.record_delivery("delivery:job-1:c", "job-1", "c")
        assert (await store.load_checkpoint("job-1")).data == b"\x00data"
        conn = await asyncpg.connect(postgres_url)
        try:
            names = await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1", schema
            )
        finally:
            await conn.close()
        assert [r[0] for r in names] == ["history", "jobs", "sent"]
    finally:
        await store.close()


async def test_concurrent_init_schema_does_not_collide(postgres_url: str) -> None:
    stores = [PostgresStore(postgres_url) for _ in range(3)]
    try:
        for store in stores:
            await store.open()
        async with anyio.create_task_group() as tg:
            for store in stores:
                tg.start_soon(store.init_schema)
        await stores[0].create_job("job-1", "agent", None)
        assert await stores[2].get_job("job-1") is not None
    finally:
        for store in stores:
            await store.close()


async def test_concurrent_claims_leave_the_highest_attempt(postgres_url: str) -> None:
    stores = [await _open(postgres_url) for _ in range(4)]
    try:
        await stores[0].create_job("job-1", "agent", None)
        outcomes: dict[int, str] = {}

        async def claim(attempt: int) -> None:
            try:
                await stores[attempt - 1].claim("job-1", attempt)
                outcomes[attempt] = "claimed"
            except Exception as exc:
                outcomes[attempt] = type(exc).__name__

        async with anyio.create_task_group() as tg:
            for attempt in (1, 2, 3, 4):
                tg.start_soon(claim, attempt)
        assert (await stores[0].get_job("job-1")).attempt == 4
        assert outcomes[4] == "claimed"
        assert set(outcomes.values()) <= {"claimed", "AttemptFenced"}
    finally:
        for store in stores:
            await store.close()


async def test_timestamps_are_unix_floats(postgres_url: str) -> None:
    store = await _open(postgres_url)
    try:
        await store.create_job("job-1", "agent", None)
        await store.claim("job-1", 1)
        await store.heartbeat("job-1", 1)
        job = await store.get_job("job-1")
        assert isinstance(job.heartbeat_at, float)
        assert isinstance(job.updated_at, float)
        assert abs(job.heartbeat_at - time.time()) < 60
    finally:
        await store.close()


def test_store_from_url_builds_postgres_store_with_masked_url() -> None:
    store = store_from_url(
        "postgres://me:hunter22-secret@127.0.0.1:5/db?sslmode=disable&password=other-secret"
    )
    assert isinstance(store, PostgresStore)
    assert "hunter22-secret" not in repr(store)
    assert "other-secret" not in store.display_url
    assert store.display_url.startswith("postgres://me:***@127.0.0.1:5/db?")


async def test_cancelled_transaction_is_rolled_back_before_reuse(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = await _open(postgres_url, min_size=1, max_size=1, command_timeout=10.0)
    blocker = await asyncpg.connect(postgres_url)
    try:
        await store.create_job("job-1", "agent", None)
        await store.claim("job-1", 1)
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute("SELECT 1 FROM job WHERE id = 'job-1' FOR UPDATE")
        # add_usage opens a transaction and waits on the row lock: cancel it there.
        with caplog.at_level(logging.ERROR), anyio.move_on_after(0.2) as scope:
            await store.add_usage("job-1", 1, 100, 10, 1.0)
        assert scope.cancelled_caught
        await lock.rollback()
        # The single pooled connection is reused: no transaction left open, nothing half-applied.
        totals = await store.add_usage("job-1", 1, 1, 1, 0.5)
        assert totals == {"input": 1, "output": 1, "cost_usd": 0.5}
        assert (await store.get_job("job-1")).tokens_consumed == totals
        # The cancelled connection was dropped, not reset with its transaction open (asyncpg logs that).
        assert not [r for r in caplog.records if r.name == "asyncio"]
    finally:
        await blocker.close()
        await store.close()


async def test_misuse_is_not_reported_as_an_outage(postgres_url: str) -> None:
    store = await _open(postgres_url)
    try:
        await store.create_job("job-1", "agent", None)
        await store.claim("job-1", 1)
        with pytest.raises(StoreError, match="refused a value") as refused:
            await store.heartbeat("job-1", "not-an-attempt")  # type: ignore[arg-type]
        assert not isinstance(refused.value, StoreUnavailable)  # not retried as an outage
        await store.heartbeat("job-1", 1)
    finally:
        await store.close()


async def test_a_value_postgresql_cannot_hold_is_one_line_not_an_internal_error(postgres_url: str) -> None:
    # An attempt another client set to the top of its integer: cancel's attempt + 1 is out of range.
    store = await _open(postgres_url)
    try:
        await store.create_job("top", "agent", None)
        conn = await asyncpg.connect(postgres_url)
        try:
            await conn.execute("UPDATE job SET attempt = 2147483647 WHERE id = 'top'")
        finally:
            await conn.close()
        with pytest.raises(StoreError, match=r"refused a value: .*out of range"):
            await store.cancel("top", "stop")
        row = await store.get_job("top")
        assert row is not None and row.attempt == 2147483647 and row.status == "PENDING"  # nothing changed
    finally:
        await store.close()


async def _sessions(url: str, application: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        count = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", application
        )
    finally:
        await conn.close()
    return int(count)


async def test_warm_opens_that_many_connections_at_open_and_no_more(postgres_url: str) -> None:
    url = f"{postgres_url}&application_name=warm-{time.monotonic_ns()}"
    application = url.rsplit("=", 1)[1]
    store = await _open(url, max_size=8, warm=5)
    try:
        # Open before the first statement needs them (a worker's slots), and the pool keeps them.
        assert await _sessions(postgres_url, application) == 5
        await store.create_job("job-1", "agent", None)
        assert await _sessions(postgres_url, application) == 5
    finally:
        await store.close()
    cold = await _open(url, max_size=8)
    try:
        assert await _sessions(postgres_url, application) == 1  # without it: one, the rest when needed
    finally:
        await cold.close()


async def test_warm_beyond_the_connection_limit_opens_what_it_may_and_the_store_works(
    postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"warm_limited_{time.monotonic_ns()}"
    postgres_server.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'pw-{name}' CONNECTION LIMIT 2")
    postgres_server.execute(f"CREATE DATABASE {name} OWNER {name}")
    url = f"postgresql://{name}:pw-{name}@127.0.0.1:{postgres_server.port}/{name}"
    caplog.set_level(logging.WARNING, logger="agentlife.store")
    store = PostgresStore(url, max_size=6, warm=5, create_schema=True)
    await store.open()  # a boot never fails for want of spare connections
    try:
        warned = [r.getMessage() for r in caplog.records if "connections at once" in r.getMessage()]
        assert len(warned) == 1 and "opened 2 of 5" in warned[0], warned
        assert f"pw-{name}" not in warned[0]
        await store.create_job("job-1", "agent", {"n": 1})
        assert (await store.get_job("job-1")).payload == {"n": 1}
    finally:
        await store.close()


@pytest.mark.parametrize(("heartbeat", "taken"), [("-infinity", True), ("infinity", False)])
async def test_a_heartbeat_at_infinity_written_by_another_client_is_judged_not_raised(
    postgres_url: str, heartbeat: str, taken: bool
) -> None:
    """PostgreSQL refuses to subtract an infinite timestamp: the claim's liveness check must not fail on one
    (the job would be stuck behind an error), but read it as a heartbeat for ever stale, or for ever fresh."""
    first, second = await _open(postgres_url), await _open(postgres_url)
    try:
        await first.create_job("inf", "a", None)
        await first.claim("inf", 1)
        conn = await asyncpg.connect(postgres_url)
        try:
            await conn.execute(
                "UPDATE job SET owner = 'pod-b:4242:99:0a0b0c0d:x', heartbeat_at = $1::text::timestamptz"
                " WHERE id = 'inf'",
                heartbeat,
            )
        finally:
            await conn.close()
        if taken:
            assert (await second.claim("inf", 1)).attempt == 1  # stale for ever: the claim takes over
        else:
            with pytest.raises(AttemptFenced):
                await second.claim("inf", 1)  # fresh for ever: another process holds it
    finally:
        await first.close()
        await second.close()


async def test_an_unflushed_checkpoint_is_fenced_and_leaves_its_connection_flushing(
    postgres_url: str,
) -> None:
    # The session default is "on" whatever the test server's own setting: the write-ahead records that
    # follow on the same pooled connection must still wait for the flush. set_config(..., true) is local
    # to the checkpoint's transaction; a session-wide one would leak "off" into them.
    url = postgres_url + ("&" if "?" in postgres_url else "?") + "synchronous_commit=on"
    store = await _open(url, max_size=1)
    try:
        await store.create_job("job-1", "agent", None)
        await store.claim("job-1", 1)
        await store.write_checkpoint("job-1", 1, "cp-1", 1, b"unflushed", [(0, b"m")], flushed=False)
        async with store._db._pool.acquire() as conn:  # max_size=1: the connection the write used
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
        loaded = await store.load_checkpoint("job-1")
        assert (loaded.checkpoint_id, loaded.data) == ("cp-1", b"unflushed")
        assert await store.load_conversation("job-1", 1) == [b"m"]
        await store.claim("job-1", 2)
        with pytest.raises(AttemptFenced):
            await store.write_checkpoint("job-1", 1, "cp-2", 2, b"late", flushed=False)
        assert (await store.load_checkpoint("job-1")).checkpoint_id == "cp-1"
    finally:
        await store.close()
