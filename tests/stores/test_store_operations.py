"""How the stores run their operations: each written once, run by a database in its dialect.

A statement names its parameters once for every database; SQLite runs an operation whole in one hop to its
thread and refuses, by name, one that awaits anything but its transaction; every operation of the store
belongs to a role its callers are typed by; and what one database appends or adds in SQL of its own keeps
rows another client wrote (a crash history that is not JSON, totals that are not numbers) as the other
does.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import orjson
import pytest

from agentlife import ConfigError
from agentlife.stores import (
    CheckpointStore,
    JobRows,
    JobStore,
    OperatorStore,
    PostgresStore,
    RateBuckets,
    SQLiteStore,
    StepRecord,
    WorkQueue,
)
from agentlife.stores._base import StepUsage
from agentlife.stores._dialect import Sql, Tx
from agentlife.stores._store import SQLStore

pytestmark = pytest.mark.anyio


def test_a_named_statement_becomes_numbered_parameters_and_keeps_its_casts() -> None:
    sql = Sql.numbered("UPDATE job SET a = :a::jsonb, b = 'x'::text WHERE id = :job_id AND a <> :a")
    assert sql.text == "UPDATE job SET a = $1::jsonb, b = 'x'::text WHERE id = $2 AND a <> $1"
    assert sql.names == ("a", "job_id")
    assert sql.values({"job_id": "j", "a": 1, "unused": 2}) == [1, "j"]
    assert Sql.named("SELECT :b, :a, :b").names == ("b", "a")


def test_every_operation_of_the_store_belongs_to_a_role() -> None:
    """A new operation is declared in the role of the callers that need it, or it is not part of the store."""

    def members(cls: type) -> set[str]:
        annotated = {name for klass in cls.__mro__ for name in getattr(klass, "__annotations__", {})}
        return {name for name in {*dir(cls), *annotated} if not name.startswith("_")}

    roles = members(JobStore) | members(WorkQueue) | members(OperatorStore) | members(JobRows)
    roles |= members(RateBuckets)
    assert members(SQLStore) - {"owner", "tables"} == members(CheckpointStore)
    assert members(CheckpointStore) == roles | {"init_schema"}


@pytest.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "agentlife.db")
    await store.open()
    yield store
    await store.close()


async def test_a_sqlite_operation_runs_whole_in_one_thread_hop(
    sqlite: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sqlite3 blocks: each operation hops to a thread once, however many statements it runs."""
    real, hops = anyio.to_thread.run_sync, [0]

    async def counted(*args: Any, **kwargs: Any) -> Any:
        hops[0] += 1
        return await real(*args, **kwargs)

    await sqlite.create_job("j", "agent", {"n": 1})
    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    row = await sqlite.claim_next("agent")
    assert row is not None and hops == [1]
    records = [StepRecord(0, row.attempt, 7, seq, b'{"type":"x"}') for seq in range(3)]
    await sqlite.write_checkpoint(
        "j", row.attempt, "c0", 0, b"state", [(0, b"m0"), (1, b"m1")], StepUsage(3, 4, 0.5), records=records
    )
    assert hops == [2]  # eight statements (row, usage, history, trim, messages, records), one hop
    assert await sqlite.load_conversation("j", 2) == [b"m0", b"m1"]
    assert len(await sqlite.load_step_records("j")) == 3


async def _sleeps_in_its_transaction(tx: Tx, job_id: str) -> None:
    async with tx.atomic():
        await tx.execute(tx.sql.wake, job_id=job_id)
        await asyncio.sleep(0)  # not the transaction's: it suspends, for the event loop


async def test_a_sqlite_operation_that_awaits_anything_else_is_refused_by_name_and_rolled_back(
    sqlite: SQLiteStore,
) -> None:
    await sqlite.create_job("j", "agent", None)
    before = await sqlite.get_job("j")
    with pytest.raises(RuntimeError, match="_sleeps_in_its_transaction awaited something other than"):
        await sqlite._db.run(_sleeps_in_its_transaction, "j")
    after = await sqlite.get_job("j")
    assert after is not None and before is not None and after.not_before == before.not_before
    other = sqlite3.connect(sqlite.path, timeout=0.5, isolation_level=None)
    try:  # no transaction was left open: another writer gets the lock at once
        other.execute("UPDATE job SET payload = '2' WHERE id = 'j'")
    finally:
        other.close()
    assert (await sqlite.claim_next("agent")) is not None  # the store goes on serving


#: A crash history each database can hold that agentlife cannot read as a list.
TORN_HISTORY = {"sqlite": "'{torn'", "postgresql": """'{"not": "a list"}'::jsonb"""}


@pytest.fixture(params=["sqlite", "postgresql"])
async def any_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[str, CheckpointStore]]:
    if request.param == "sqlite":
        store: CheckpointStore = SQLiteStore(tmp_path / "agentlife.db")
    else:
        store = PostgresStore(request.getfixturevalue("postgres_url"), create_schema=True)
    await store.open()
    yield request.param, store
    await store.close()


async def _raw(store: CheckpointStore, statement: str) -> list[Any]:
    """One statement from another client."""
    if isinstance(store, SQLiteStore):
        conn = sqlite3.connect(store.path, isolation_level=None)
        try:
            return conn.execute(statement).fetchall()
        finally:
            conn.close()
    import asyncpg

    assert isinstance(store, PostgresStore)
    pg = await asyncpg.connect(store._db._url)
    try:
        return list(await pg.fetch(statement))
    finally:
        await pg.close()


async def test_a_status_write_keeps_a_crash_history_another_client_wrote_badly(
    any_store: tuple[str, CheckpointStore],
) -> None:
    """The crash record is appended and what the history held stays in it: nothing lost, nothing raised."""
    kind, store = any_store
    await store.create_job("j", "agent", None)
    await store.claim("j", 1)
    await _raw(store, f"UPDATE job SET error = {TORN_HISTORY[kind]} WHERE id = 'j'")
    crash = {"at": 1.0, "attempt": 1, "exit_code": 1, "error_class": "Boom", "message": "boom"}
    await store.set_status("j", 1, "RETRYING", error=crash)
    ((stored,),) = await _raw(store, "SELECT error FROM job WHERE id = 'j'")
    history = orjson.loads(stored)
    assert history[-1] == crash and len(history) == 2
    kept = history[0]
    assert kept == {"not": "a list"} if kind == "postgresql" else kept["raw"] == "{torn"


@pytest.mark.parametrize(
    "totals",
    [
        """'{"input": "7", "output": true, "cost_usd": 1.5, "other": 3}'""",
        """'{"input": 2, "output": null}'""",
        "'[1, 2]'",
    ],
)
async def test_a_checkpoint_adds_the_steps_usage_only_to_totals_that_are_numbers(
    any_store: tuple[str, CheckpointStore], totals: str
) -> None:
    kind, store = any_store
    await store.create_job("j", "agent", None)
    await store.claim("j", 1)
    cast = "::jsonb" if kind == "postgresql" else ""
    await _raw(store, f"UPDATE job SET tokens_consumed = {totals}{cast} WHERE id = 'j'")
    before = orjson.loads(totals.strip("'"))
    await store.write_checkpoint("j", 1, "c0", 0, b"state", usage=StepUsage(10, 5, 0.25))
    row = await store.get_job("j")
    assert row is not None
    base = before if isinstance(before, dict) else {}
    number = {k: v for k, v in base.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    assert row.tokens_consumed == {
        "input": number.get("input", 0) + 10,
        "output": number.get("output", 0) + 5,
        "cost_usd": number.get("cost_usd", 0) + 0.25,
    }


async def test_sqlite_adds_usage_to_totals_that_are_not_json_from_zero(sqlite: SQLiteStore) -> None:
    await sqlite.create_job("j", "agent", None)
    await sqlite.claim("j", 1)
    await _raw(sqlite, "UPDATE job SET tokens_consumed = 'torn {' WHERE id = 'j'")
    await sqlite.write_checkpoint("j", 1, "c0", 0, b"state", usage=StepUsage(10, 5, 0.25))
    row = await sqlite.get_job("j")
    assert row is not None and row.tokens_consumed == {"input": 10, "output": 5, "cost_usd": 0.25}


#: An event payload each database can hold that no JSON reader takes: a number out of a float's range, and
#: on SQLite (whose column takes any text) a payload that is not JSON at all.
UNREADABLE_PAYLOADS = {
    "sqlite": ["'1e400'", "'{torn'"],
    "postgresql": ["'1e400'::jsonb", "'[[[[1]]]]'::jsonb"],
}


async def test_an_event_whose_payload_cannot_be_read_is_set_aside_and_the_next_one_taken(
    any_store: tuple[str, CheckpointStore], caplog: pytest.LogCaptureFixture
) -> None:
    """Such an event failed the wait on every attempt; now the wait takes the next event and says why."""
    kind, store = any_store
    await store.create_job("j", "agent", None)
    await store.claim("j", 1)
    bad = UNREADABLE_PAYLOADS[kind]
    for n in range(len(bad)):
        await store.send_event("j", "answer", {"n": n})
    await store.send_event("j", "answer", {"n": "good"})
    if kind == "postgresql":  # nested deeper than any JSON reader goes
        bad[1] = "'" + "[" * 2000 + "]" * 2000 + "'::jsonb"
    for seq, payload in enumerate(bad, start=1):
        await _raw(store, f"UPDATE job_event SET payload = {payload} WHERE seq = {seq}")
    with caplog.at_level(logging.WARNING, "agentlife.store"):
        taken = await store.take_event("j", 1, ["answer"], "j/0/0")
        assert taken == ("answer", {"n": "good"})
        assert await store.take_event("j", 1, ["answer"], "j/0/0") == taken  # the same on replay
    assert [r.getMessage() for r in caplog.records].count(
        "job j: event 'answer' has a payload that cannot be read (JSONDecodeError); set aside, not delivered"
    ) == len(bad)
    assert await store.kept_events("j") == {}  # set aside: no wait takes them and none is listed as kept
    marks = await _raw(store, "SELECT taken_by FROM job_event ORDER BY seq")
    assert [row[0] for row in marks] == ["unreadable:j/0/0"] * len(bad) + ["j/0/0"]


@pytest.mark.parametrize(
    ("columns", "why"),
    [
        ("'x', 1, 1, 1, X'7B7D'", "a step that is not a number"),
        ("0, 1.5, 1, 1, X'7B7D'", "an attempt that is not an integer"),
        ("0, 1, 1, 2, 3.25", "data that is a number"),
    ],
)
async def test_a_sqlite_step_record_that_is_not_one_is_passed_over_at_load(
    sqlite: SQLiteStore, columns: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    await sqlite.create_job("j", "agent", None)
    await sqlite.claim("j", 1)
    await sqlite.append_step_records("j", 1, [StepRecord(0, 1, 1, 1, b'{"type": "TOOL_STARTED"}')])
    await _raw(sqlite, "INSERT INTO step_record VALUES ('j', 0, 1, 1, 0, '{\"type\": \"WAIT_STARTED\"}')")
    await _raw(
        sqlite, f"INSERT INTO step_record (job_id, step, attempt, session, seq, data) VALUES ('j', {columns})"
    )
    with caplog.at_level(logging.WARNING, "agentlife.store"):
        records = await sqlite.load_step_records("j")
    # The readable rows, a TEXT line among them, in order; the bad one passed over with a warning.
    assert records == [
        StepRecord(0, 1, 1, 0, b'{"type": "WAIT_STARTED"}'),
        StepRecord(0, 1, 1, 1, b'{"type": "TOOL_STARTED"}'),
    ], why
    assert any("a step record that is not one" in r.getMessage() for r in caplog.records), why


@pytest.mark.parametrize("at", ["'294276-01-01'", "'4713-01-01 BC'", "'10000-01-01'"])
async def test_a_postgres_time_past_a_datetime_s_years_reads_as_infinity_and_stops_no_reader(
    postgres_url: str, at: str
) -> None:
    # Such a time (another client wrote it) made asyncpg raise OverflowError: `job list` failed for the
    # whole table, `job show` and `job cancel` on the row. It reads as PostgreSQL's infinity reads.
    store = PostgresStore(postgres_url, create_schema=True)
    await store.open()
    try:
        await store.create_job("odd", "agent", None)
        await store.create_job("fine", "agent", None)
        await _raw(
            store,
            f"UPDATE job SET updated_at = {at}, heartbeat_at = {at}, not_before = {at} WHERE id = 'odd'",
        )
        listed = await store.list_jobs(None, None, 10)
        assert sorted(row.id for row in listed) == ["fine", "odd"]
        row = await store.get_job("odd")
        assert row is not None and row.updated_at is not None and not math.isnan(row.updated_at)
        assert row.updated_at < -1e10 if "BC" in at else row.updated_at > 1e11  # as -infinity, or infinity
        assert (await store.cancel("odd", "stop")).status == "FAILED"
        assert (await store.get_job("fine")) is not None
    finally:
        await store.close()


@pytest.mark.parametrize("payload", ["\x00", {"a": "x\x00y"}, {"\x00k": 1}, [["deep\x00"]]])
async def test_a_payload_holding_u0000_is_refused_alike_on_both_stores(
    any_store: tuple[str, CheckpointStore], payload: Any
) -> None:
    # PostgreSQL's JSON cannot store U+0000 (an internal error there), SQLite can: both refuse it, in one
    # line, for an event and for a child job's payload as for `job create`.
    from agentlife._jobrefs import check_child_payload

    _, store = any_store
    await store.create_job("j", "agent", None)
    with pytest.raises(ConfigError, match=r"holds U\+0000 in a string"):
        await store.send_event("j", "answer", payload)
    with pytest.raises(ConfigError, match=r"holds U\+0000 in a string"):
        check_child_payload(payload)
    assert await store.kept_events("j") == {}


@pytest.mark.parametrize("attempt", ["X'41'", "'abc'", "1e20", "2.5"])
async def test_a_sqlite_attempt_that_is_not_a_whole_number_stops_neither_cancel_nor_the_reaper(
    sqlite: SQLiteStore, attempt: str
) -> None:
    # Another client's BLOB or text attempt made `job cancel` fail (bytes into the crash record's JSON) and
    # the reaper raise on int(b'A'): the row reads as attempt 0, flagged unreadable, and nothing raises.
    for job_id in ("odd", "fine"):
        await sqlite.create_job(job_id, "agent", None)
        await sqlite.claim(job_id, 1)
    await _raw(sqlite, "UPDATE job SET heartbeat_at = 0 WHERE id IN ('odd', 'fine')")
    await _raw(sqlite, f"UPDATE job SET attempt = {attempt} WHERE id = 'odd'")
    row = await sqlite.get_job("odd")
    assert row is not None and row.attempt == 0 and "attempt" in row.unreadable
    decisions = await sqlite.reap(1.0)
    assert [d.job_id for d in decisions] == ["fine"]  # the readable stale row is reaped, the other passed by
    cancelled = await sqlite.cancel("odd", "stop")
    assert cancelled.status == "FAILED"
