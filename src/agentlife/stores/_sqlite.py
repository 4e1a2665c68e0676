"""The embedded `CheckpointStore`: stdlib sqlite3, run off the event loop on a worker thread."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import orjson

from agentlife._exceptions import AttemptFenced, JobNotFound, StoreError, StoreUnavailable
from agentlife.stores._base import (
    HISTORY_KEEP,
    JobRecord,
    JobStatus,
    LoadedCheckpoint,
    StepUsage,
    TableNames,
    add_usage_totals,
    claim_refusal,
    crc32,
    first_valid_checkpoint,
    new_owner,
)
from agentlife.stores._childjobs import SQLiteChildOps, sqlite_child_columns, sqlite_child_schema
from agentlife.stores._events import SQLiteEventOps, sqlite_event_schema
from agentlife.stores._jobs import RUNNABLE, TERMINAL, expected_statuses
from agentlife.stores._rows import JSON_COLUMNS, job_record
from agentlife.stores._sqlite_jobs import FENCE as _FENCE
from agentlife.stores._sqlite_jobs import SQLiteJobOps, sqlite_job_schema
from agentlife.stores._steprecords import SQLiteStepRecordOps, StepRecord, sqlite_step_record_schema
from agentlife.stores._waits import SQLiteWaitOps

__all__ = ["SQLiteStore"]

_T = TypeVar("_T")
_ROW_COLUMNS = (
    "id",
    "agent_id",
    "status",
    "attempt",
    "checkpoint_id",
    "checkpoint_crc",
    "heartbeat_at",
    "updated_at",
    "not_before",
    *JSON_COLUMNS,
)
_JSON_AS_BYTES = ", ".join(f"CAST({name} AS BLOB)" for name in JSON_COLUMNS)
_TEXT_COLUMNS = ("id", "agent_id", "status")
_TEXT_AS_BYTES = ", ".join(f"CAST({name} AS BLOB)" for name in _TEXT_COLUMNS)


def _text_columns(columns: dict[str, Any], *, id_type: str) -> dict[str, str]:
    """Decode the text columns in place (bytes that are not UTF-8 with U+FFFD); the ones that did not decode.

    An id that is not text at all (a BLOB inserted by another client) names no row ``WHERE id = ?`` can
    find, so it is unreadable even when its bytes decode.
    """
    unreadable: dict[str, str] = {}
    for name in _TEXT_COLUMNS:
        raw = columns[name]
        if raw is None:
            continue
        try:
            columns[name] = bytes(raw).decode()
        except UnicodeDecodeError:
            columns[name] = bytes(raw).decode(errors="replace")
            unreadable[name] = "not UTF-8 text"
    if id_type != "text" and "id" not in unreadable:
        unreadable["id"] = f"a {id_type}, not text"
    return unreadable


def _stored_key(raw: Any, id_type: str) -> str | bytes | None:
    """`JobRecord.key` of an id that did not read as text: its BLOB's bytes, or its text's bytes escaped."""
    if raw is None or id_type not in ("blob", "text"):
        return None
    return bytes(raw) if id_type == "blob" else bytes(raw).decode("utf-8", "surrogateescape")


# A checkpoint never lands on a job that has ended: a terminal row is not rewritten by a late writer.
_LIVE = f"status NOT IN ({', '.join(repr(str(s)) for s in TERMINAL)})"


def _schema(t: TableNames) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS {t.job} (
            id TEXT PRIMARY KEY,
            agent_id TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'PENDING',
            payload TEXT,
            attempt INTEGER NOT NULL DEFAULT 0,
            checkpoint BLOB,
            checkpoint_crc INTEGER,
            checkpoint_id TEXT,
            heartbeat_at REAL,
            tokens_consumed TEXT NOT NULL DEFAULT '{{"input": 0, "output": 0, "cost_usd": 0.0}}',
            token_budget TEXT,
            error TEXT NOT NULL DEFAULT '[]',
            result TEXT,
            updated_at REAL NOT NULL,
            owner TEXT,
            not_before REAL
        )""",
        f"""CREATE TABLE IF NOT EXISTS {t.checkpoint_history} (
            job_id TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            step INTEGER NOT NULL,
            checkpoint BLOB NOT NULL,
            crc INTEGER NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (job_id, checkpoint_id)
        )""",
        _history_index(t.checkpoint_history),
        f"""CREATE TABLE IF NOT EXISTS {t.delivery} (
            key TEXT PRIMARY KEY,
            job_id TEXT NOT NULL,
            channel TEXT NOT NULL,
            delivered_at REAL NOT NULL
        )""",
        f"""CREATE TABLE IF NOT EXISTS {t.conversation} (
            job_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            step INTEGER NOT NULL,
            message BLOB NOT NULL,
            PRIMARY KEY (job_id, seq)
        )""",
    ]


def _history_index(table: str) -> str:
    # SQLite wants the schema on the index name, not on the table: CREATE INDEX s.i ON t (...).
    schema, _, base = table.rpartition(".")
    name = f"{schema + '.' if schema else ''}{base}_job_created"
    return f"CREATE INDEX IF NOT EXISTS {name} ON {base} (job_id, created_at DESC)"


class SQLiteStore(SQLiteJobOps, SQLiteWaitOps, SQLiteEventOps, SQLiteChildOps, SQLiteStepRecordOps):
    """`CheckpointStore` over one SQLite file (``sqlite:///path``), the embedded default.

    sqlite3 blocks, so every statement runs on a worker thread; a lock serialises them on the single
    connection. The file is opened in WAL mode with ``synchronous=FULL``: a returned checkpoint is on disk.
    """

    url_scheme = "sqlite"

    def __init__(
        self,
        path: str | Path,
        *,
        tables: TableNames | None = None,
        create_schema: bool = True,
        must_exist: bool = False,
    ) -> None:
        self.path = Path(path)
        self.tables = tables or TableNames()
        self._create_schema = create_schema
        #: `open` refuses a file that does not exist or holds no job table, instead of creating one.
        self.must_exist = must_exist
        #: The URL the path came from, to explain a missing store (``sqlite:///tmp/x`` is relative).
        self.url: str | None = None
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._busy = False
        #: This process's claim token, written to the row's ``owner`` column at claim.
        self.owner = new_owner()
        self._claimed: set[str] = set()

    @classmethod
    def from_url(cls, url: str, *, tables: TableNames | None = None, must_exist: bool = False) -> SQLiteStore:
        """Build from ``sqlite:///relative/or/absolute/path``."""
        path = url.removeprefix("sqlite://")
        if path.startswith("/") and not url.startswith("sqlite:////"):
            path = path[1:]
        store = cls(path or ".agentlife/agentlife.db", tables=tables, must_exist=must_exist)
        store.url = url
        return store

    # -- plumbing -------------------------------------------------------------------------------------

    async def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        def call() -> _T:
            with self._lock:
                if self._conn is None:
                    raise StoreUnavailable("SQLite store is closed")
                self._busy = True
                try:
                    return fn(self._conn)
                except sqlite3.OperationalError as exc:
                    if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                        # Not StoreUnavailable: retrying for the step budget cannot free the disk.
                        raise StoreError(f"SQLite store {self.path}: database or disk is full") from exc
                    raise StoreUnavailable(f"SQLite error: {exc}") from exc
                finally:
                    self._busy = False

        return await anyio.to_thread.run_sync(call)

    async def open(self) -> None:
        def connect() -> sqlite3.Connection:
            if self.must_exist:
                # mode=rw: sqlite3 would otherwise create the file it was asked to read.
                # One leading slash: "file://x" would make x the URI's authority.
                target = f"file:{urllib.parse.quote(self._absolute())}?mode=rw"
                conn = sqlite3.connect(
                    target, uri=True, timeout=10.0, check_same_thread=False, isolation_level=None
                )
                if not self._has_job_table(conn):  # checked before WAL mode changes the file
                    conn.close()
                    raise _NotAStore(f"it holds no {self.tables.job} table")
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, timeout=10.0, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=10000")
            return conn

        if self.must_exist and not self.path.is_file():
            raise StoreError(self._missing())
        try:
            self._conn = await anyio.to_thread.run_sync(connect)
        except _NotAStore as exc:
            raise StoreError(self._missing(str(exc))) from None
        except (sqlite3.Error, OSError) as exc:
            if self.must_exist and not self.path.is_file():
                raise StoreError(self._missing()) from None
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {exc}") from exc
        if self._create_schema:
            await self.init_schema()

    def _has_job_table(self, conn: sqlite3.Connection) -> bool:
        schema, _, base = self.tables.job.rpartition(".")
        master = f"{schema}.sqlite_master" if schema else "sqlite_master"
        try:
            row = conn.execute(
                f"SELECT 1 FROM {master} WHERE type = 'table' AND name = ?", (base,)
            ).fetchone()
        except sqlite3.DatabaseError:  # not a database at all ("file is not a database")
            return False
        return row is not None

    def _absolute(self) -> str:
        # sqlite:////abs gives the path "//abs", which POSIX keeps as it is.
        return "/" + str(self.path.absolute()).lstrip("/")

    def _missing(self, why: str = "") -> str:
        """``no store at PATH``, saying why and how a relative URL was read."""
        text = f"no store at {self._absolute()}"
        if why:
            text += f": {why}"
        url = self.url or ""
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
            rest = url.removeprefix("sqlite:///")
            text += f" ({url} is relative to the current directory; for /{rest} write sqlite:////{rest})"
        if not why:
            text += "; `python -m agentlife db init` creates one"
        return text

    async def close(self) -> None:
        def close_when_idle() -> None:
            # Under the statement lock: closing a connection while another thread's statement runs on it
            # is a use-after-free in the sqlite3 module (a segfault), e.g. a job heartbeat still in flight
            # when cleanup closes the store.
            with self._lock:
                conn, self._conn = self._conn, None
                if conn is not None:
                    self._release(conn)
                    conn.close()

        await anyio.to_thread.run_sync(close_when_idle)

    async def drop_claim(self, job_id: str) -> None:
        def drop(conn: sqlite3.Connection) -> None:
            self._claimed.discard(job_id)
            conn.execute(
                f"UPDATE {self.tables.job} SET owner = NULL WHERE id = ? AND owner = ?", (job_id, self.owner)
            )

        await self._run(drop)

    def _release(self, conn: sqlite3.Connection) -> None:
        """Give up this store's claims: the claim lasts while the store is open, a re-run may take it then."""
        if not self._claimed:
            return
        ids = sorted(self._claimed)
        self._claimed.clear()
        # A full disk or a locked file: the pid check lets a re-run take the claim anyway.
        with contextlib.suppress(sqlite3.Error):
            conn.execute(
                f"UPDATE {self.tables.job} SET owner = NULL WHERE owner = ?"
                f" AND id IN ({', '.join('?' * len(ids))})",
                (self.owner, *ids),
            )

    async def init_schema(self) -> None:
        def create(conn: sqlite3.Connection) -> None:
            # A new database is made in one transaction: one fsync instead of one per statement (about 6 ms
            # of every fresh pod's boot). IMMEDIATE takes the write lock first, so a second process making
            # the same file waits for the first and then finds every table there.
            fresh = not self._has_job_table(conn)
            if not fresh:
                make(conn)
                return
            conn.execute("BEGIN IMMEDIATE")
            try:
                make(conn)
            except BaseException:
                if conn.in_transaction:  # SQLite may have rolled back already (a full disk)
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

        def make(conn: sqlite3.Connection) -> None:
            for statement in _schema(self.tables):
                conn.execute(statement)
            # A database made before the claim token existed gets its column here (db init, or any open).
            schema, _, base = self.tables.job.rpartition(".")
            columns = conn.execute(f"PRAGMA {schema + '.' if schema else ''}table_info({base})").fetchall()
            names = {column[1] for column in columns}
            if "owner" not in names:
                conn.execute(f"ALTER TABLE {self.tables.job} ADD COLUMN owner TEXT")
            if "not_before" not in names:  # a 0.2 database: the worker's runnable-job lookup needs it
                conn.execute(f"ALTER TABLE {self.tables.job} ADD COLUMN not_before REAL")
            if "approval" not in names:  # the call a job is parked on and the calls approved (0.3)
                conn.execute(f"ALTER TABLE {self.tables.job} ADD COLUMN approval TEXT")
            if "waiting" not in names:  # what a WAITING job waits for (durable waits)
                conn.execute(f"ALTER TABLE {self.tables.job} ADD COLUMN waiting TEXT")
            for column, kind in sqlite_child_columns():  # who started a child job (child jobs)
                if column not in names:
                    conn.execute(f"ALTER TABLE {self.tables.job} ADD COLUMN {column} {kind}")
            for statement in [
                *sqlite_job_schema(self.tables),
                *sqlite_event_schema(self.tables),
                *sqlite_child_schema(self.tables),
                *sqlite_step_record_schema(self.tables),
            ]:
                conn.execute(statement)

        await self._run(create)

    def has_free_connection(self) -> bool:
        # One connection serialised by a lock: it is "taken" only while a statement runs.
        return self._conn is not None

    # -- jobs -----------------------------------------------------------------------------------------

    def _row(
        self, conn: sqlite3.Connection, job_id: str | None, *, rowid: int | None = None
    ) -> JobRecord | None:
        # Every text column as bytes: text that is not UTF-8 (written by another client) would make sqlite3
        # raise on the fetch itself; `job_record` decodes each JSON column and names those it cannot read,
        # `_text_columns` the id, the agent id and the status.
        key, value = ("id", job_id) if rowid is None else ("rowid", rowid)
        row = conn.execute(
            f"SELECT {_TEXT_AS_BYTES}, attempt, checkpoint_id, checkpoint_crc, heartbeat_at, updated_at,"
            f" not_before, {_JSON_AS_BYTES}, typeof(id) FROM {self.tables.job} WHERE {key} = ?",
            (value,),
        ).fetchone()
        if row is None:
            return None
        columns = dict(zip(_ROW_COLUMNS, row[:-1], strict=True))
        stored_id = columns["id"]
        unreadable = _text_columns(columns, id_type=row[-1])
        record = job_record(columns)
        if unreadable:
            stored = _stored_key(stored_id, row[-1]) if "id" in unreadable else None
            record = dataclasses.replace(record, unreadable={**unreadable, **record.unreadable}, key=stored)
        return record

    async def get_job(self, job_id: str) -> JobRecord | None:
        return await self._run(lambda conn: self._row(conn, job_id))

    async def create_job(
        self, job_id: str, agent_id: str, payload: Any, token_budget: dict[str, Any] | None = None
    ) -> JobRecord:
        def create(conn: sqlite3.Connection) -> JobRecord:
            now = time.time()
            conn.execute(
                f"INSERT OR IGNORE INTO {self.tables.job}"
                " (id, agent_id, status, payload, attempt, token_budget, updated_at, not_before)"
                " VALUES (?, ?, ?, ?, 0, ?, ?, ?)",
                (job_id, agent_id, JobStatus.PENDING, _dumps(payload), _dumps(token_budget), now, now),
            )
            record = self._row(conn, job_id)
            assert record is not None
            return record

        return await self._run(create)

    async def claim(self, job_id: str, attempt: int) -> JobRecord:
        def claim(conn: sqlite3.Connection) -> JobRecord:
            conn.execute("BEGIN IMMEDIATE")
            try:
                record = self._row(conn, job_id)
                if record is None:
                    raise JobNotFound(f"job {job_id} does not exist")
                (row_owner,) = conn.execute(
                    f"SELECT owner FROM {self.tables.job} WHERE id = ?", (job_id,)
                ).fetchone()
                now = time.time()
                age = None if record.heartbeat_at is None else now - record.heartbeat_at
                refusal = claim_refusal(job_id, attempt, record.attempt, row_owner, self.owner, age)
                if refusal is not None:
                    raise AttemptFenced(refusal)
                status = record.status
                if status in RUNNABLE:
                    status = JobStatus.RUNNING
                conn.execute(
                    f"UPDATE {self.tables.job} SET attempt = ?, status = ?, owner = ?, heartbeat_at = ?,"
                    " updated_at = ? WHERE id = ?",
                    (attempt, status, self.owner, now, now, job_id),
                )
                self._claimed.add(job_id)
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
            claimed = self._row(conn, job_id)
            assert claimed is not None
            return claimed

        return await self._run(claim)

    def _fenced(self, conn: sqlite3.Connection, cursor: sqlite3.Cursor, job_id: str, attempt: int) -> None:
        if cursor.rowcount == 0:
            raise AttemptFenced(
                f"job {job_id}: write by attempt {attempt} refused, a later attempt owns the row"
            )

    # -- checkpoints ----------------------------------------------------------------------------------

    async def load_checkpoint(self, job_id: str) -> LoadedCheckpoint | None:
        def load(conn: sqlite3.Connection) -> LoadedCheckpoint | None:
            row = conn.execute(
                f"SELECT checkpoint, checkpoint_crc, checkpoint_id FROM {self.tables.job} WHERE id = ?",
                (job_id,),
            ).fetchone()
            if row is None:
                raise JobNotFound(f"job {job_id} does not exist")
            data, crc, checkpoint_id = row
            if data is None:
                return None
            if crc32(bytes(data)) == crc:
                return LoadedCheckpoint(checkpoint_id, bytes(data), crc, "job")
            history = conn.execute(
                f"SELECT checkpoint_id, checkpoint, crc, step FROM {self.tables.checkpoint_history}"
                " WHERE job_id = ? ORDER BY created_at DESC, step DESC",
                (job_id,),
            ).fetchall()
            return first_valid_checkpoint(job_id, history)

        return await self._run(load)

    async def write_checkpoint(
        self,
        job_id: str,
        attempt: int,
        checkpoint_id: str,
        step: int,
        data: bytes,
        messages: Sequence[tuple[int, bytes]] = (),
        usage: StepUsage | None = None,
        *,
        records: Sequence[StepRecord] = (),
        prune_before: int | None = None,
    ) -> int:
        crc = crc32(data)

        def write(conn: sqlite3.Connection) -> int:
            now = time.time()
            conn.execute("BEGIN IMMEDIATE")
            try:
                cursor = conn.execute(
                    f"UPDATE {self.tables.job} SET checkpoint = ?, checkpoint_crc = ?, checkpoint_id = ?,"
                    f" updated_at = ?, heartbeat_at = ? WHERE id = ? AND {_FENCE} AND {_LIVE}",
                    (data, crc, checkpoint_id, now, now, job_id, attempt, self.owner),
                )
                self._fenced(conn, cursor, job_id, attempt)
                if usage:
                    self._add_step_usage(conn, job_id, usage)
                h = self.tables.checkpoint_history
                conn.execute(
                    f"INSERT OR REPLACE INTO {h} (job_id, checkpoint_id, step, checkpoint, crc, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (job_id, checkpoint_id, step, data, crc, now),
                )
                conn.execute(
                    f"DELETE FROM {h} WHERE job_id = ? AND checkpoint_id NOT IN"
                    f" (SELECT checkpoint_id FROM {h}"
                    " WHERE job_id = ? ORDER BY created_at DESC, step DESC LIMIT ?)",
                    (job_id, job_id, HISTORY_KEEP),
                )
                if messages:
                    conn.executemany(
                        f"INSERT OR REPLACE INTO {self.tables.conversation} (job_id, seq, step, message)"
                        " VALUES (?, ?, ?, ?)",
                        [(job_id, seq, step, message) for seq, message in messages],
                    )
                if records:
                    self._insert_step_records(conn, job_id, records)
                if prune_before is not None:
                    self._prune_step_records(conn, job_id, prune_before)
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
            return crc

        return await self._run(write)

    def _add_step_usage(self, conn: sqlite3.Connection, job_id: str, usage: StepUsage) -> None:
        job = self.tables.job
        row = conn.execute(f"SELECT tokens_consumed FROM {job} WHERE id = ?", (job_id,)).fetchone()
        try:
            totals = _loads(row[0]) if row else None
        except ValueError:  # not JSON (a hand-made row): count from 0 rather than lose the step
            totals = None
        conn.execute(
            f"UPDATE {self.tables.job} SET tokens_consumed = ? WHERE id = ?",
            (_dumps(usage.added_to(totals)), job_id),
        )

    async def load_conversation(self, job_id: str, length: int) -> list[bytes]:
        def load(conn: sqlite3.Connection) -> list[bytes]:
            rows = conn.execute(
                f"SELECT message FROM {self.tables.conversation} WHERE job_id = ? AND seq < ? ORDER BY seq",
                (job_id, length),
            ).fetchall()
            return [_row_bytes(row[0]) for row in rows]

        return await self._run(load)

    # -- status, usage, heartbeat ---------------------------------------------------------------------

    async def set_status(
        self,
        job_id: str,
        attempt: int,
        status: str,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
        expect: Sequence[str] | None = None,
    ) -> None:
        allowed = expected_statuses(expect)

        def update(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute(
                    f"SELECT error, status FROM {self.tables.job} WHERE id = ? AND {_FENCE}",
                    (job_id, attempt, self.owner),
                ).fetchone()
                if row is None:
                    raise AttemptFenced(f"job {job_id}: status write by attempt {attempt} refused")
                if row[1] not in allowed:
                    raise AttemptFenced(
                        f"job {job_id}: {status} by attempt {attempt} refused: the row is {row[1]}"
                    )
                errors = _loads(row[0]) or []
                if error is not None:
                    errors.append(error)
                conn.execute(
                    f"UPDATE {self.tables.job} SET status = ?, result = COALESCE(?, result), error = ?,"
                    " updated_at = ? WHERE id = ? AND attempt = ?",
                    (str(status), _dumps(result), _dumps(errors), time.time(), job_id, attempt),
                )
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise

        await self._run(update)

    async def add_usage(
        self, job_id: str, attempt: int, input_tokens: int, output_tokens: int, cost_usd: float
    ) -> dict[str, Any]:
        def add(conn: sqlite3.Connection) -> dict[str, Any]:
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute(
                    f"SELECT tokens_consumed FROM {self.tables.job} WHERE id = ? AND {_FENCE}",
                    (job_id, attempt, self.owner),
                ).fetchone()
                if row is None:
                    raise AttemptFenced(f"job {job_id}: usage write by attempt {attempt} refused")
                totals = add_usage_totals(_loads(row[0]) or {}, input_tokens, output_tokens, cost_usd)
                conn.execute(
                    f"UPDATE {self.tables.job} SET tokens_consumed = ?, updated_at = ? WHERE id = ?",
                    (_dumps(totals), time.time(), job_id),
                )
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
            return totals

        return await self._run(add)

    async def heartbeat(self, job_id: str, attempt: int) -> None:
        def beat(conn: sqlite3.Connection) -> None:
            cursor = conn.execute(
                f"UPDATE {self.tables.job} SET heartbeat_at = ? WHERE id = ? AND {_FENCE}",
                (time.time(), job_id, attempt, self.owner),
            )
            self._fenced(conn, cursor, job_id, attempt)

        await self._run(beat)

    # -- delivery registry ----------------------------------------------------------------------------

    async def is_delivered(self, key: str) -> bool:
        def check(conn: sqlite3.Connection) -> bool:
            return (
                conn.execute(f"SELECT 1 FROM {self.tables.delivery} WHERE key = ?", (key,)).fetchone()
                is not None
            )

        return await self._run(check)

    async def record_delivery(self, key: str, job_id: str, channel: str) -> None:
        def record(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"INSERT OR IGNORE INTO {self.tables.delivery} (key, job_id, channel, delivered_at)"
                " VALUES (?, ?, ?, ?)",
                (key, job_id, channel, time.time()),
            )

        await self._run(record)


class _NotAStore(StoreError):
    """The file a job command was pointed at exists but is not an agentlife store."""


def _dumps(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def _loads(value: str | bytes | None) -> Any:
    return None if value is None else orjson.loads(value)


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back what is left of a failed transaction without masking the error that failed it.

    SQLite rolls a transaction back by itself on some errors (a full disk among them), and a ROLLBACK
    then fails with "cannot rollback - no transaction is active", hiding the real cause.
    """
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _row_bytes(value: Any) -> bytes:
    """A stored conversation row as bytes: SQLite keeps whatever type was written, a hand edit's TEXT too.

    Whatever it is becomes bytes and the conversation's digest decides, never an error of its own
    (``bytes(5)`` would be five zero bytes, ``bytes("x")`` a TypeError).
    """
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8", "backslashreplace")
