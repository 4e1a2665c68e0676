"""The `CheckpointStore` contract, run unchanged against SQLiteStore and PostgresStore.

Each test gets a fresh database: a temporary SQLite file, or a new database on the session's real PostgreSQL
server. ``Backend.raw`` reaches around the store to corrupt rows and inspect history, as a disk fault or an
operator would.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentlife import AttemptFenced, CheckpointCorrupt, JobNotFound
from agentlife.stores import (
    HISTORY_KEEP,
    CheckpointStore,
    JobStatus,
    PostgresStore,
    SQLiteStore,
    StepRecord,
    TableNames,
    crc32,
)
from agentlife.stores._base import StepUsage

pytestmark = pytest.mark.anyio

StoreFactory = Callable[..., Awaitable[CheckpointStore]]


@dataclass
class Backend:
    """How to open more stores on the same database and how to touch its rows directly."""

    kind: str
    location: str  # SQLite path or PostgreSQL URL
    tables: TableNames

    def open_store(self, tables: TableNames | None = None, **kwargs: Any) -> CheckpointStore:
        tables = tables or self.tables
        if self.kind == "sqlite":
            return SQLiteStore(self.location, tables=tables)
        return PostgresStore(self.location, tables=tables, **kwargs)

    async def raw(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """Run one statement outside the store; ``$1``-style placeholders work on both backends."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.location, isolation_level=None)
            try:
                for n in range(len(args), 0, -1):
                    sql = sql.replace(f"${n}", "?")
                return [tuple(row) for row in conn.execute(sql, args).fetchall()]
            finally:
                conn.close()
        import asyncpg

        conn = await asyncpg.connect(self.location)
        try:
            return [tuple(row) for row in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    async def flip_job_checkpoint_byte(self, job_id: str) -> None:
        (data,) = (await self.raw(f"SELECT checkpoint FROM {self.tables.job} WHERE id = $1", job_id))[0]
        await self.raw(
            f"UPDATE {self.tables.job} SET checkpoint = $1 WHERE id = $2", _flip(bytes(data)), job_id
        )

    async def flip_history_byte(self, job_id: str, checkpoint_id: str) -> None:
        h = self.tables.checkpoint_history
        (data,) = (
            await self.raw(
                f"SELECT checkpoint FROM {h} WHERE job_id = $1 AND checkpoint_id = $2", job_id, checkpoint_id
            )
        )[0]
        await self.raw(
            f"UPDATE {h} SET checkpoint = $1 WHERE job_id = $2 AND checkpoint_id = $3",
            _flip(bytes(data)),
            job_id,
            checkpoint_id,
        )

    async def history_ids(self, job_id: str) -> list[str]:
        h = self.tables.checkpoint_history
        rows = await self.raw(f"SELECT checkpoint_id FROM {h} WHERE job_id = $1 ORDER BY step", job_id)
        return [row[0] for row in rows]


def _flip(data: bytes, index: int = 0) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", str(tmp_path / "agentlife.db"), TableNames())
    return Backend("postgresql", request.getfixturevalue("postgres_url"), TableNames())


@pytest.fixture
async def make_store(backend: Backend) -> AsyncIterator[StoreFactory]:
    """Open (and, at teardown, close) any number of stores on the test's database."""
    opened: list[CheckpointStore] = []

    async def make(tables: TableNames | None = None, **kwargs: Any) -> CheckpointStore:
        store = backend.open_store(tables, **kwargs)
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


async def _running_job(store: CheckpointStore, job_id: str = "job-1", attempt: int = 1) -> None:
    await store.create_job(job_id, "agent-a", {"task": "review"})
    await store.claim(job_id, attempt)


# -- jobs ---------------------------------------------------------------------------------------------


async def test_store_satisfies_the_protocol(store: CheckpointStore) -> None:
    assert isinstance(store, CheckpointStore)


async def test_create_and_get_job_round_trips_json_columns(store: CheckpointStore) -> None:
    payload = {"text": "h\u00e9llo \u2603", "n": [1, 2.5, None, True], "nested": {"k": "v"}}
    created = await store.create_job(
        "job-1", "agent-a", payload, {"max_input_tokens": 1000, "max_cost_usd": 1.5}
    )

    fetched = await store.get_job("job-1")
    assert fetched == created
    assert fetched.agent_id == "agent-a"
    assert fetched.status == JobStatus.PENDING
    assert fetched.attempt == 0
    assert fetched.payload == payload
    assert fetched.token_budget == {"max_input_tokens": 1000, "max_cost_usd": 1.5}
    assert fetched.tokens_consumed == {"input": 0, "output": 0, "cost_usd": 0.0}
    assert fetched.error == []
    assert fetched.checkpoint_id is None
    assert fetched.heartbeat_at is None
    assert isinstance(fetched.updated_at, float)
    assert abs(fetched.updated_at - time.time()) < 60


async def test_get_missing_job_is_none(store: CheckpointStore) -> None:
    assert await store.get_job("nope") is None


async def test_create_existing_job_keeps_the_row(store: CheckpointStore) -> None:
    await store.create_job("job-1", "agent-a", {"v": 1})
    await store.claim("job-1", 3)
    again = await store.create_job("job-1", "agent-b", {"v": 2})
    assert (again.agent_id, again.payload, again.attempt, again.status) == ("agent-a", {"v": 1}, 3, "RUNNING")


# -- claim --------------------------------------------------------------------------------------------


async def test_claim_takes_pending_job_to_running(store: CheckpointStore) -> None:
    await store.create_job("job-1", "agent-a", None)
    claimed = await store.claim("job-1", 1)
    assert (claimed.attempt, claimed.status) == (1, "RUNNING")
    assert await store.get_job("job-1") == claimed


async def test_claim_with_equal_or_higher_attempt_succeeds(store: CheckpointStore) -> None:
    await _running_job(store, attempt=2)
    assert (await store.claim("job-1", 2)).attempt == 2
    assert (await store.claim("job-1", 5)).attempt == 5


async def test_claim_with_lower_attempt_is_fenced_and_changes_nothing(store: CheckpointStore) -> None:
    await _running_job(store, attempt=3)
    before = await store.get_job("job-1")
    with pytest.raises(AttemptFenced, match="attempt 3"):
        await store.claim("job-1", 2)
    assert await store.get_job("job-1") == before


async def test_claim_missing_job_raises_job_not_found(store: CheckpointStore) -> None:
    with pytest.raises(JobNotFound):
        await store.claim("ghost", 1)


@pytest.mark.parametrize(
    ("status", "after"),
    [
        ("PENDING", "RUNNING"),
        ("RETRYING", "RUNNING"),
        ("RUNNING", "RUNNING"),
        ("WAITING_FOR_APPROVAL", "WAITING_FOR_APPROVAL"),
        ("COMPLETED", "COMPLETED"),
    ],
)
async def test_claim_moves_only_pending_and_retrying_to_running(
    store: CheckpointStore, status: str, after: str
) -> None:
    await _running_job(store, attempt=1)
    await store.set_status("job-1", 1, status)
    assert (await store.claim("job-1", 2)).status == after


# -- checkpoints --------------------------------------------------------------------------------------

_TRICKY = [
    b"",
    b"\x00",
    b"\x00\x01\x02\xff\xfe\xfd",
    "caf\u00e9".encode("latin-1"),  # valid Latin-1, invalid UTF-8
    b"\xc3\x28\xa0\xa1 not utf-8 \x00 with NUL",
    b'{"step": 3, "state": {"k": "v"}}',
    os.urandom(256 * 1024),  # beyond PostgreSQL's TOAST threshold
]


@pytest.mark.parametrize("data", _TRICKY, ids=lambda d: f"{len(d)}B")
async def test_checkpoint_round_trips_exact_bytes(store: CheckpointStore, data: bytes) -> None:
    await _running_job(store)
    crc = await store.write_checkpoint("job-1", 1, "cp-0001", 1, data)

    loaded = await store.load_checkpoint("job-1")
    assert loaded is not None
    assert (loaded.data, loaded.crc, loaded.checkpoint_id, loaded.source) == (data, crc, "cp-0001", "job")
    assert type(loaded.data) is bytes


async def test_crc_is_over_the_exact_stored_bytes(store: CheckpointStore) -> None:
    # A CRC with the top bit set would overflow a signed 32-bit column.
    data = next(d for d in (f"payload-{i}".encode() for i in range(1000)) if zlib.crc32(d) >= 2**31)
    await _running_job(store)
    crc = await store.write_checkpoint("job-1", 1, "cp-1", 1, data)

    assert crc == zlib.crc32(data) & 0xFFFFFFFF == crc32(data)
    job = await store.get_job("job-1")
    assert (job.checkpoint_crc, job.checkpoint_id) == (crc, "cp-1")


async def test_checkpoints_with_and_without_conversation_rows_keep_the_rows_and_the_fence(
    store: CheckpointStore,
) -> None:
    # A step that adds no message writes without the rows (another statement on PostgreSQL); the rows of
    # the steps that did stay, and both forms are refused to an attempt that lost the row.
    await _running_job(store)
    await store.write_checkpoint("job-1", 1, "cp-1", 1, b"one")
    await store.write_checkpoint("job-1", 1, "cp-2", 2, b"two", [(0, b"m0"), (1, b"m1")])
    await store.write_checkpoint("job-1", 1, "cp-3", 3, b"three")
    assert await store.load_conversation("job-1", 2) == [b"m0", b"m1"]
    loaded = await store.load_checkpoint("job-1")
    assert loaded is not None and (loaded.data, loaded.checkpoint_id) == (b"three", "cp-3")
    await store.claim("job-1", 2)
    for messages in ([], [(2, b"late")]):
        with pytest.raises(AttemptFenced):
            await store.write_checkpoint("job-1", 1, "cp-late", 4, b"late", messages)
    assert await store.load_conversation("job-1", 3) == [b"m0", b"m1"]
    loaded = await store.load_checkpoint("job-1")
    assert loaded is not None and loaded.checkpoint_id == "cp-3"


async def test_fresh_job_has_no_checkpoint(store: CheckpointStore) -> None:
    await _running_job(store)
    assert await store.load_checkpoint("job-1") is None


async def test_load_checkpoint_of_missing_job_raises(store: CheckpointStore) -> None:
    with pytest.raises(JobNotFound):
        await store.load_checkpoint("ghost")


async def test_newest_checkpoint_wins(store: CheckpointStore) -> None:
    await _running_job(store)
    for step in range(3):
        await store.write_checkpoint("job-1", 1, f"cp-{step}", step, f"state {step}".encode())
    loaded = await store.load_checkpoint("job-1")
    assert (loaded.checkpoint_id, loaded.data) == ("cp-2", b"state 2")


async def test_flipped_byte_in_job_row_falls_back_to_history(
    store: CheckpointStore, backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    await _running_job(store)
    for step in range(3):
        await store.write_checkpoint("job-1", 1, f"cp-{step}", step, f"state {step}".encode())
    await backend.flip_job_checkpoint_byte("job-1")

    with caplog.at_level(logging.ERROR, logger="agentlife.store"):
        loaded = await store.load_checkpoint("job-1")

    # The history holds an intact copy of the newest checkpoint.
    assert (loaded.checkpoint_id, loaded.data, loaded.source, loaded.step) == (
        "cp-2",
        b"state 2",
        "history",
        2,
    )
    assert "Checkpoint CRC mismatch for job job-1" in caplog.messages


async def test_fallback_skips_corrupt_history_entries(store: CheckpointStore, backend: Backend) -> None:
    await _running_job(store)
    for step in range(3):
        await store.write_checkpoint("job-1", 1, f"cp-{step}", step, f"state {step}".encode())
    await backend.flip_job_checkpoint_byte("job-1")
    await backend.flip_history_byte("job-1", "cp-2")

    loaded = await store.load_checkpoint("job-1")
    assert (loaded.checkpoint_id, loaded.data, loaded.source, loaded.step) == (
        "cp-1",
        b"state 1",
        "history",
        1,
    )


async def test_everything_corrupt_raises_checkpoint_corrupt(
    store: CheckpointStore, backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    await _running_job(store)
    for step in range(3):
        await store.write_checkpoint("job-1", 1, f"cp-{step}", step, f"state {step}".encode())
    await backend.flip_job_checkpoint_byte("job-1")
    for step in range(3):
        await backend.flip_history_byte("job-1", f"cp-{step}")

    with (
        caplog.at_level(logging.ERROR, logger="agentlife.store"),
        pytest.raises(CheckpointCorrupt, match="job-1"),
    ):
        await store.load_checkpoint("job-1")
    assert "Checkpoint CRC mismatch for job job-1" in caplog.messages


async def test_history_keeps_the_last_n(store: CheckpointStore, backend: Backend) -> None:
    await _running_job(store)
    await _running_job(store, "job-2")
    total = HISTORY_KEEP + 3
    for step in range(total):
        await store.write_checkpoint("job-1", 1, f"cp-{step:02d}", step, f"s{step}".encode())
    await store.write_checkpoint("job-2", 1, "other", 0, b"x")

    assert await backend.history_ids("job-1") == [
        f"cp-{step:02d}" for step in range(total - HISTORY_KEEP, total)
    ]
    assert await backend.history_ids("job-2") == ["other"]  # trimming is per job


async def test_rewriting_a_checkpoint_id_replaces_its_history_entry(
    store: CheckpointStore, backend: Backend
) -> None:
    await _running_job(store)
    await store.write_checkpoint("job-1", 1, "cp-a", 1, b"first")
    await store.write_checkpoint("job-1", 1, "cp-a", 1, b"second")
    assert await backend.history_ids("job-1") == ["cp-a"]
    assert (await store.load_checkpoint("job-1")).data == b"second"


# -- fencing ------------------------------------------------------------------------------------------


async def test_only_the_owning_attempt_writes(make_store: StoreFactory, backend: Backend) -> None:
    zombie = await make_store()
    successor = await make_store()
    await zombie.create_job("job-1", "agent-a", None)
    await zombie.claim("job-1", 1)
    await zombie.write_checkpoint("job-1", 1, "cp-zombie", 1, b"zombie state")
    await zombie.add_usage("job-1", 1, 10, 5, 0.01)
    await zombie.heartbeat("job-1", 1)

    await successor.claim("job-1", 2)
    before = await successor.get_job("job-1")
    history_before = await backend.history_ids("job-1")

    with pytest.raises(AttemptFenced):
        await zombie.write_checkpoint("job-1", 1, "cp-stale", 2, b"stale state")
    with pytest.raises(AttemptFenced):
        await zombie.set_status("job-1", 1, "COMPLETED", result={"stale": True}, error={"message": "x"})
    with pytest.raises(AttemptFenced):
        await zombie.add_usage("job-1", 1, 1000, 1000, 1.0)
    with pytest.raises(AttemptFenced):
        await zombie.heartbeat("job-1", 1)
    with pytest.raises(AttemptFenced):
        await zombie.claim("job-1", 1)

    assert await successor.get_job("job-1") == before  # not a column touched, updated_at included
    assert await backend.history_ids("job-1") == history_before
    assert (await successor.load_checkpoint("job-1")).data == b"zombie state"

    # The owner's writes land.
    await successor.write_checkpoint("job-1", 2, "cp-next", 2, b"successor state")
    await successor.set_status("job-1", 2, "COMPLETED", result={"ok": True})
    await successor.heartbeat("job-1", 2)
    totals = await successor.add_usage("job-1", 2, 1, 1, 0.0)
    job = await zombie.get_job("job-1")  # the zombie may still read
    assert (job.checkpoint_id, job.status, job.result, job.attempt) == (
        "cp-next",
        "COMPLETED",
        {"ok": True},
        2,
    )
    assert totals["input"] == 11


async def test_write_for_missing_job_is_fenced(store: CheckpointStore) -> None:
    with pytest.raises(AttemptFenced):
        await store.write_checkpoint("ghost", 1, "cp", 0, b"x")


# -- status, usage, heartbeat -------------------------------------------------------------------------


async def test_usage_accumulates(store: CheckpointStore) -> None:
    await _running_job(store)
    first = await store.add_usage("job-1", 1, 100, 20, 0.1)
    second = await store.add_usage("job-1", 1, 50, 5, 0.2)
    assert first == {"input": 100, "output": 20, "cost_usd": 0.1}
    assert second == {"input": 150, "output": 25, "cost_usd": 0.3}  # rounded, not 0.30000000000000004
    assert (await store.get_job("job-1")).tokens_consumed == second


async def test_crash_records_are_appended_to_error(store: CheckpointStore) -> None:
    await _running_job(store)
    crashes = [
        {"exit_code": 1, "error_class": "ValueError", "message": "boom", "at": 1.5, "attempt": 1},
        {"exit_code": 137, "error_class": "OOMKilled", "message": "", "at": 2.5, "attempt": 1},
    ]
    for crash in crashes:
        await store.set_status("job-1", 1, "RETRYING", error=crash)
    job = await store.get_job("job-1")
    assert (job.status, job.error) == ("RETRYING", crashes)


async def test_set_status_keeps_result_unless_given(store: CheckpointStore) -> None:
    await _running_job(store)
    await store.set_status("job-1", 1, "RUNNING", result={"summary": "done", "n": [1, 2]})
    await store.set_status("job-1", 1, "WAITING_FOR_APPROVAL")
    job = await store.get_job("job-1")
    assert (job.status, job.result, job.error) == (
        "WAITING_FOR_APPROVAL",
        {"summary": "done", "n": [1, 2]},
        [],
    )


@pytest.mark.parametrize("terminal", ["COMPLETED", "FAILED", "DEAD_LETTER"])
async def test_a_terminal_row_is_never_rewritten_by_a_late_writer(
    store: CheckpointStore, terminal: str
) -> None:
    await _running_job(store)
    await store.write_checkpoint("job-1", 1, "cp-1", 0, b"before")
    await store.set_status("job-1", 1, terminal, result={"final": True})
    before = await store.get_job("job-1")
    crash = {"exit_code": 1, "error_class": "E", "message": "late", "at": 1.0, "attempt": 1}
    late_writes: list[Callable[[], Awaitable[Any]]] = [
        lambda: store.set_status("job-1", 1, "COMPLETED", result={"late": True}),
        lambda: store.set_status("job-1", 1, "RUNNING", error=crash),
        lambda: store.set_status("job-1", 1, terminal, error=crash),
        lambda: store.write_checkpoint("job-1", 1, "cp-late", 1, b"late"),
    ]
    for write in late_writes:
        with pytest.raises(AttemptFenced, match="refused"):
            await write()
    after = await store.get_job("job-1")
    assert (after.status, after.result, after.error, after.checkpoint_id) == (
        terminal,
        {"final": True},
        [],
        "cp-1",
    )
    assert after.updated_at == before.updated_at


async def test_a_status_write_happens_only_from_the_statuses_it_expects(store: CheckpointStore) -> None:
    await _running_job(store)
    with pytest.raises(AttemptFenced, match=r"WAITING_FOR_APPROVAL .* refused: the row is RUNNING"):
        await store.set_status("job-1", 1, "WAITING_FOR_APPROVAL", expect=["PENDING"])
    assert (await store.get_job("job-1")).status == "RUNNING"
    await store.set_status("job-1", 1, "WAITING_FOR_APPROVAL", expect=["RUNNING"])
    assert (await store.get_job("job-1")).status == "WAITING_FOR_APPROVAL"


async def test_heartbeat_sets_heartbeat_at(store: CheckpointStore) -> None:
    await _running_job(store)
    await store.heartbeat("job-1", 1)
    first = (await store.get_job("job-1")).heartbeat_at
    assert first is not None
    assert abs(first - time.time()) < 60
    await store.heartbeat("job-1", 1)
    assert (await store.get_job("job-1")).heartbeat_at >= first


# -- delivery registry --------------------------------------------------------------------------------


async def test_delivery_registry_is_idempotent(store: CheckpointStore, backend: Backend) -> None:
    key = "delivery:job-1:slack"
    assert not await store.is_delivered(key)
    await store.record_delivery(key, "job-1", "slack")
    await store.record_delivery(key, "job-1", "slack")
    assert await store.is_delivered(key)
    assert not await store.is_delivered("delivery:job-1:email")
    assert await backend.raw(f"SELECT key, job_id, channel FROM {backend.tables.delivery}") == [
        (key, "job-1", "slack")
    ]


# -- configuration and lifecycle ----------------------------------------------------------------------


async def test_configurable_table_names(make_store: StoreFactory, backend: Backend) -> None:
    tables = TableNames(job="cp_jobs", checkpoint_history="cp_checkpoints", delivery="cp_deliveries")
    store = await make_store(tables)
    await _running_job(store)
    await store.write_checkpoint("job-1", 1, "cp-1", 1, b"data")
    await store.record_delivery("delivery:job-1:x", "job-1", "x")

    assert await backend.raw("SELECT id, checkpoint_id FROM cp_jobs") == [("job-1", "cp-1")]
    assert await backend.raw("SELECT checkpoint_id FROM cp_checkpoints") == [("cp-1",)]
    assert await backend.raw("SELECT key FROM cp_deliveries") == [("delivery:job-1:x",)]
    with pytest.raises(Exception, match="job"):  # the default tables were never created
        await backend.raw("SELECT count(*) FROM job")


async def test_init_schema_is_idempotent(store: CheckpointStore) -> None:
    await _running_job(store)
    await store.init_schema()
    assert (await store.get_job("job-1")).status == "RUNNING"


async def test_has_free_connection_follows_open_and_close(backend: Backend) -> None:
    store = backend.open_store()
    assert not store.has_free_connection()
    await store.open()
    try:
        assert store.has_free_connection()
    finally:
        await store.close()
    assert not store.has_free_connection()
    await store.close()  # twice is fine


# -- the step's one commit: checkpoint, conversation rows, usage, heartbeat ---------------------------


async def test_checkpoint_write_adds_the_steps_usage_and_beats_in_the_same_commit(
    store: CheckpointStore,
) -> None:
    await _running_job(store)
    await store.add_usage("job-1", 1, 5, 1, 0.25)
    await store.write_checkpoint(
        "job-1", 1, "cp-1", 0, b"s0", [(0, b'"m0"'), (1, b'"m1"')], StepUsage(100, 7, 0.5)
    )
    await store.write_checkpoint(
        "job-1", 1, "cp-2", 1, b"s1", [(2, b'"m2"')], StepUsage()
    )  # no calls: unchanged

    job = await store.get_job("job-1")
    assert job.tokens_consumed == {"input": 105, "output": 8, "cost_usd": pytest.approx(0.75)}
    assert job.heartbeat_at is not None and abs(job.heartbeat_at - time.time()) < 60
    assert await store.load_conversation("job-1", 3) == [b'"m0"', b'"m1"', b'"m2"']


async def test_a_fenced_checkpoint_write_adds_no_usage_and_no_rows(make_store: StoreFactory) -> None:
    first, second = await make_store(), await make_store()
    await _running_job(first)
    await second.claim("job-1", 2)
    with pytest.raises(AttemptFenced):
        await first.write_checkpoint("job-1", 1, "cp-1", 0, b"s0", [(0, b'"m0"')], StepUsage(100, 7, 0.5))

    job = await second.get_job("job-1")
    assert job.checkpoint_id is None and job.tokens_consumed.get("input", 0) == 0
    assert await second.load_conversation("job-1", 5) == []


async def test_usage_of_a_hand_made_tokens_consumed_counts_from_zero(
    backend: Backend, store: CheckpointStore
) -> None:
    await _running_job(store)
    value = '{"input": "lots", "output": [1], "cost_usd": null}'
    if backend.kind == "sqlite":
        await backend.raw("UPDATE job SET tokens_consumed = ? WHERE id = ?", value, "job-1")
    else:
        await backend.raw("UPDATE job SET tokens_consumed = $1::jsonb WHERE id = $2", value, "job-1")
    await store.write_checkpoint("job-1", 1, "cp-1", 0, b"s0", (), StepUsage(3, 2, 0.1))

    job = await store.get_job("job-1")
    assert job.tokens_consumed == {"input": 3, "output": 2, "cost_usd": pytest.approx(0.1)}


@pytest.mark.parametrize(
    ("waiting", "woken"),
    [
        ('{"kind": "jobs", "jobs": ["kid-1"]}', True),  # the parent waits for this child alone: woken
        ('{"kind": "jobs", "jobs": ["kid-1", "kid-2"]}', False),  # another child still runs
        ("not json {", False),  # written by someone else: never woken by it, and the child's end stands
        ('{"kind": "jobs", "jobs": "kid-1"}', False),  # a string where the list belongs
        ('{"kind": "jobs", "jobs": [1, null, {"x": 2}]}', False),
    ],
)
async def test_a_childs_end_wakes_its_waiting_parent_only_on_a_sound_waiting_column(
    backend: Backend, store: CheckpointStore, waiting: str, woken: bool
) -> None:
    # The trigger runs inside the child's status write: whatever the parent's row holds, that write must
    # succeed, and only a parent whose waiting column names the ended child (and no child still running) is
    # made runnable.
    await _running_job(store, "parent")
    assert await store.start_child("parent", 1, "kid-1", "agent-a", None, invocation_id="parent/0/1")
    assert await store.start_child("parent", 1, "kid-2", "agent-a", None, invocation_id="parent/0/2")
    far = "9999999999" if backend.kind == "sqlite" else "to_timestamp(9999999999)"
    sql_waiting = waiting if backend.kind == "sqlite" else waiting.replace("'", "''")
    cast = "" if backend.kind == "sqlite" else "::jsonb"
    if cast and waiting.startswith("not json"):
        return  # jsonb refuses it on PostgreSQL: no such row can exist there
    await backend.raw(
        f"UPDATE {backend.tables.job} SET status = 'WAITING', not_before = {far},"
        f" waiting = '{sql_waiting}'{cast} WHERE id = 'parent'"
    )
    ended = await store.cancel("kid-1", "done with it")
    assert ended.status == "FAILED"
    parent = await store.get_job("parent")
    assert parent is not None and parent.status == "WAITING"
    due = "not_before" if backend.kind == "sqlite" else "EXTRACT(EPOCH FROM not_before)::float8"
    ((not_before,),) = await backend.raw(f"SELECT {due} FROM {backend.tables.job} WHERE id = 'parent'")
    assert (float(not_before) < time.time() + 60) is woken, not_before


# -- step records: what a resumed step replays, on any pod ----------------------------------------------


def _record(step: int, seq: int, *, attempt: int = 1, session: int = 1000, text: str = "x") -> StepRecord:
    return StepRecord(
        step, attempt, session, seq, b'{"type": "T", "step": %d, "t": "%s"}' % (step, text.encode())
    )


async def test_step_records_are_stored_in_order_and_a_second_write_of_one_changes_nothing(
    store: CheckpointStore,
) -> None:
    await _running_job(store)
    await store.append_step_records("job-1", 1, [_record(3, 5), _record(3, 6)])
    # A write retried after its answer was lost: the rows stay as first written, nothing is refused.
    await store.append_step_records("job-1", 1, [_record(3, 6, text="again"), _record(3, 7)])
    await store.claim("job-1", 2)
    await store.append_step_records("job-1", 2, [_record(3, 0, attempt=2, session=999)])

    records = await store.load_step_records("job-1")
    assert [(r.attempt, r.session, r.seq) for r in records] == [
        (1, 1000, 5),
        (1, 1000, 6),
        (1, 1000, 7),
        (2, 999, 0),
    ]
    assert records[1].data == _record(3, 6).data
    assert await store.load_step_records("other") == []


async def test_a_step_record_of_an_attempt_that_lost_the_job_is_refused_and_writes_nothing(
    make_store: StoreFactory,
) -> None:
    zombie = await make_store()
    successor = await make_store()
    await _running_job(zombie)
    await zombie.append_step_records("job-1", 1, [_record(0, 1)])
    await successor.claim("job-1", 2)

    with pytest.raises(AttemptFenced):
        await zombie.append_step_records("job-1", 1, [_record(0, 2)])
    # The same attempt in another process (another claim token) is refused too.
    same_attempt = await make_store()
    with pytest.raises(AttemptFenced):
        await same_attempt.append_step_records("job-1", 2, [_record(0, 3, attempt=2)])
    with pytest.raises(AttemptFenced):
        await zombie.append_step_records("ghost", 1, [_record(0, 1)])
    await successor.set_status("job-1", 2, "COMPLETED", result={"ok": True})
    with pytest.raises(AttemptFenced):  # an ended job takes nothing more
        await successor.append_step_records("job-1", 2, [_record(0, 4, attempt=2)])
    assert [r.seq for r in await successor.load_step_records("job-1")] == [1]


async def test_a_checkpoint_writes_a_parked_steps_records_and_removes_those_before_its_window(
    store: CheckpointStore,
) -> None:
    await _running_job(store)
    await store.append_step_records("job-1", 1, [_record(step, step) for step in range(4)])
    await store.write_checkpoint(
        "job-1", 1, "cp-park", 3, b"parked", records=[_record(4, 10), _record(4, 11)], prune_before=2
    )
    assert [(r.step, r.seq) for r in await store.load_step_records("job-1")] == [
        (2, 2),
        (3, 3),
        (4, 10),
        (4, 11),
    ]


async def test_a_fenced_checkpoint_writes_no_step_records_and_removes_none(make_store: StoreFactory) -> None:
    zombie = await make_store()
    successor = await make_store()
    await _running_job(zombie)
    await zombie.append_step_records("job-1", 1, [_record(0, 1)])
    await successor.claim("job-1", 2)
    with pytest.raises(AttemptFenced):
        await zombie.write_checkpoint("job-1", 1, "cp", 5, b"x", records=[_record(6, 1)], prune_before=6)
    assert [(r.step, r.seq) for r in await successor.load_step_records("job-1")] == [(0, 1)]


# -- what happened first: a wait's deadline against an event's send and a child's end ----------------------


async def test_an_event_sent_after_the_deadline_is_not_taken_by_the_wait(store: CheckpointStore) -> None:
    await _running_job(store)
    await store.send_event("job-1", "answer", {"n": 1})
    deadline = time.time()
    time.sleep(0.01)  # the stores' clocks resolve well under this
    await store.send_event("job-1", "answer", {"n": 2})

    # The wait whose deadline came before the second send takes the first, then nothing.
    assert await store.take_event("job-1", 1, ["answer"], "job-1/0/0", sent_by=deadline) == (
        "answer",
        {"n": 1},
    )
    assert await store.take_event("job-1", 1, ["answer"], "job-1/0/1", sent_by=deadline) is None
    # Without a deadline (or a later one) the late event is there for a wait.
    assert await store.take_event("job-1", 1, ["answer"], "job-1/0/1") == ("answer", {"n": 2})
    # A wait asked again after a crash gets what it took, whatever its deadline.
    assert await store.take_event("job-1", 1, ["answer"], "job-1/0/0", sent_by=0.0) == ("answer", {"n": 1})


async def test_a_child_that_ended_after_the_deadline_is_reported_unfinished(store: CheckpointStore) -> None:
    await _running_job(store, "parent")
    for kid in ("kid-1", "kid-2"):
        assert await store.start_child("parent", 1, kid, "agent-a", None, invocation_id=f"parent/0/{kid}")
    await store.claim("kid-1", 1)
    await store.set_status("kid-1", 1, "COMPLETED", result={"early": True})
    deadline = time.time()
    time.sleep(0.01)
    await store.claim("kid-2", 1)
    await store.set_status("kid-2", 1, "COMPLETED", result={"late": True})

    early, late = await store.child_outcomes("parent", ["kid-1", "kid-2"], ended_by=deadline)
    assert (early.status, early.result, early.finished) == ("COMPLETED", {"early": True}, True)
    assert (late.status, late.result, late.finished) == ("RUNNING", None, False)
    assert all(o.finished for o in await store.child_outcomes("parent", ["kid-1", "kid-2"]))


async def test_every_job_row_created_has_an_incarnation_of_its_own(
    backend: Backend, store: CheckpointStore
) -> None:
    # A fresh job's journal replay matches this token: two creations of one id (another store, a job
    # created again after its tombstone expired) must never share it.
    await _running_job(store, "parent")
    assert await store.start_child("parent", 1, "kid", "agent-a", None, invocation_id="parent/0/1")
    first = await store.get_job("parent")
    await backend.raw(f"DELETE FROM {backend.tables.job} WHERE id = 'parent'")
    await store.create_job("parent", "agent-a", None)
    again, kid = await store.get_job("parent"), await store.get_job("kid")
    tokens = [row.incarnation if row is not None else None for row in (first, again, kid)]
    assert all(tokens) and len(set(tokens)) == 3, tokens
