"""The embedded store: `SQLiteStore`, stdlib sqlite3 run off the event loop on a worker thread.

sqlite3 blocks, so each operation runs on a worker thread, whole: one thread hop per operation, not one
per statement. Its `SQLiteTx` calls sqlite3 directly, so an operation's coroutine never suspends and is
run to its end in one call (`_run_to_end`); one that awaits anything else is a bug, reported as such. A lock
serialises the operations on the single connection. The file is opened in WAL mode with
``synchronous=FULL``: a returned checkpoint is on disk.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio
import anyio.to_thread
import orjson

from agentlife._exceptions import StoreError, StoreUnavailable
from agentlife.stores._base import JobRecord, TableNames
from agentlife.stores._dialect import Chain, Guarded, Many, Op, P, Row, Sql, Statement, Statements
from agentlife.stores._sqlite_schema import has_job_table, make_schema
from agentlife.stores._sqlite_sql import sqlite_job, sqlite_statements
from agentlife.stores._store import SQLStore

__all__ = ["SQLiteStore"]

T = TypeVar("T")
#: What a statement returned: its rows, and how many rows it changed (a write) or returned (a read).
_Result = tuple[list[sqlite3.Row], int]


class SQLiteStore(SQLStore["SQLiteDatabase"]):
    """`CheckpointStore` over one SQLite file (``sqlite:///path``), the embedded default.

    Args:
        path: the database file (made, with its folder, unless ``must_exist``).
        tables: table names, to fit an existing schema.
        create_schema: make what is missing of the schema at `open`.
        must_exist: `open` refuses a file that does not exist or holds no job table (``no store at PATH``,
            `agentlife.StoreError`) instead of creating one.
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
        tables = tables or TableNames()
        super().__init__(SQLiteDatabase(Path(path), tables, create_schema, must_exist), tables)

    @classmethod
    def from_url(cls, url: str, *, tables: TableNames | None = None, must_exist: bool = False) -> SQLiteStore:
        """Build from ``sqlite:///relative/or/absolute/path``."""
        path = url.removeprefix("sqlite://")
        if path.startswith("/") and not url.startswith("sqlite:////"):
            path = path[1:]
        store = cls(path or ".agentlife/agentlife.db", tables=tables, must_exist=must_exist)
        store._db.url = url
        return store

    @property
    def path(self) -> Path:
        """The database file."""
        return self._db.path

    @property
    def must_exist(self) -> bool:
        """`open` refuses a file that does not exist or holds no job table, instead of creating one."""
        return self._db.must_exist


class SQLiteDatabase:
    """The `Database` of a `SQLiteStore`: one connection, its lock, and the runner of operations."""

    def __init__(self, path: Path, tables: TableNames, create_schema: bool, must_exist: bool) -> None:
        self.path = path
        self.tables = tables
        self.create_schema = create_schema
        self.must_exist = must_exist
        #: The URL the path came from, to explain a missing store (``sqlite:///tmp/x`` is relative).
        self.url: str | None = None
        self.sql = sqlite_statements(tables)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    async def run(self, op: Op[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``op`` on the store's thread, whole, under the connection's lock."""
        return await self._on_thread(
            lambda conn: _run_to_end(op(SQLiteTx(conn, self.sql), *args, **kwargs), op)
        )

    async def _on_thread(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(connection)`` on a worker thread, under the lock; sqlite3's errors mapped to the store's."""

        def call() -> T:
            with self._lock:
                if self._conn is None:
                    raise StoreUnavailable("SQLite store is closed")
                try:
                    return fn(self._conn)
                except sqlite3.OperationalError as exc:
                    if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                        # Not StoreUnavailable: retrying for the step budget cannot free the disk.
                        raise StoreError(f"SQLite store {self.path}: database or disk is full") from exc
                    raise StoreUnavailable(f"SQLite error: {exc}") from exc

        return await anyio.to_thread.run_sync(call)

    async def open(self) -> None:
        """Open the file (WAL, ``synchronous=FULL``) and, unless told not to, make the schema."""
        if self.must_exist and not self.path.is_file():
            raise StoreError(self._missing())
        try:
            self._conn = await anyio.to_thread.run_sync(self._connect)
        except _NotAStore as exc:
            raise StoreError(self._missing(str(exc))) from None
        except (sqlite3.Error, OSError) as exc:
            if self.must_exist and not self.path.is_file():
                raise StoreError(self._missing()) from None
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {exc}") from exc
        if self.create_schema:
            await self.init_schema()

    def _connect(self) -> sqlite3.Connection:
        if self.must_exist:
            # mode=rw: sqlite3 would otherwise create the file it was asked to read.
            # One leading slash: "file://x" would make x the URI's authority.
            target = f"file:{urllib.parse.quote(self._absolute())}?mode=rw"
            conn = sqlite3.connect(
                target, uri=True, timeout=10.0, check_same_thread=False, isolation_level=None
            )
            if not has_job_table(conn, self.tables):  # checked before WAL mode changes the file
                conn.close()
                raise _NotAStore(f"it holds no {self.tables.job} table")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=10.0, check_same_thread=False, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

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
        """Close the connection once no statement runs on it; idempotent."""

        def close_when_idle() -> None:
            # Under the statement lock: closing a connection while another thread's statement runs on it
            # is a use-after-free in the sqlite3 module (a segfault), e.g. a job heartbeat still in flight
            # when cleanup closes the store.
            with self._lock:
                conn, self._conn = self._conn, None
                if conn is not None:
                    conn.close()

        await anyio.to_thread.run_sync(close_when_idle)

    async def init_schema(self) -> None:
        """Create what is missing (a new database in one transaction: one fsync, not one per statement)."""
        await self._on_thread(lambda conn: make_schema(conn, self.tables))

    def has_free_connection(self) -> bool:
        """One connection serialised by a lock: it is "taken" only while a statement runs."""
        return self._conn is not None


class _NotAStore(StoreError):
    """The file a job command was pointed at exists but is not an agentlife store."""


def _run_to_end(coroutine: Coroutine[Any, Any, T], op: object) -> T:
    """Run an operation's coroutine to its end in this call: its `SQLiteTx` never suspends it.

    Raises:
        RuntimeError: the operation awaited something other than its transaction (it would need the event
            loop, which this thread does not run).
    """
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coroutine.close()
    name = getattr(op, "__qualname__", repr(op))
    raise RuntimeError(
        f"store operation {name} awaited something other than its SQLite transaction: an operation runs"
        " whole on the store's thread, so it may await only the transaction's methods"
    )


class SQLiteTx:
    """The `Tx` of one SQLite operation: sqlite3 called directly, so awaiting a method never suspends."""

    def __init__(self, conn: sqlite3.Connection, sql: Statements) -> None:
        self.connection = conn
        self.sql = sql
        self.now = time.time()

    @contextlib.asynccontextmanager
    async def atomic(self) -> AsyncIterator[object]:
        """``BEGIN IMMEDIATE``: the write lock first, so a read-check-write is atomic across processes."""
        conn = self.connection
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield self
        except BaseException:
            _rollback(conn)
            raise
        conn.execute("COMMIT")

    def job(self, row: Row) -> JobRecord:
        """A job row read as `sqlite_statements` select it."""
        return sqlite_job(row)

    async def fetch(self, statement: Statement, **params: Any) -> Sequence[Row]:
        """Every row the statement returns."""
        return self._run(statement, params)[0]

    async def fetchrow(self, statement: Statement, **params: Any) -> Row | None:
        """The first row the statement returns, or None."""
        rows = self._run(statement, params)[0]
        return rows[0] if rows else None

    async def fetchval(self, statement: Statement, **params: Any) -> Any:
        """The first column of the first row, or None."""
        rows = self._run(statement, params)[0]
        return rows[0][0] if rows else None

    async def execute(self, statement: Statement, **params: Any) -> int:
        """How many rows the statement changed (or returned)."""
        return self._run(statement, params)[1]

    def _run(self, statement: Statement, params: dict[str, Any]) -> _Result:
        params["now"] = self.now
        if isinstance(statement, Sql):
            return self._one(statement, params)
        conn = self.connection
        if conn.in_transaction:
            return self._composite(statement, params)
        conn.execute("BEGIN IMMEDIATE")  # a composite stands for one statement: it commits whole
        try:
            result = self._composite(statement, params)
        except BaseException:
            _rollback(conn)
            raise
        conn.execute("COMMIT")
        return result

    def _composite(self, statement: Chain | Guarded | Many, params: dict[str, Any]) -> _Result:
        if isinstance(statement, Many):
            return self._many(statement, params)
        if isinstance(statement, Chain):
            known, result = dict(params), _NOTHING
            for step in statement.steps:
                result = self._one(step, known)
                if not result[1]:
                    return _NOTHING
                if result[0]:
                    known.update(zip(result[0][0].keys(), result[0][0], strict=True))
            return result
        guard = self._one(statement.guard, params)
        if guard[1]:
            for then in statement.then:
                self._many(then, params) if isinstance(then, Many) else self._one(then, params)
        return guard

    def _one(self, sql: Sql, params: dict[str, Any]) -> _Result:
        cursor = self.connection.execute(sql.text, _bound(sql.text, params))
        if cursor.description is None:
            return [], cursor.rowcount
        rows = cursor.fetchall()
        return rows, len(rows)

    def _many(self, many: Many, params: dict[str, Any]) -> _Result:
        fixed = _bound(many.sql.text, params)
        columns = zip(*(params[name] for name in many.over), strict=True)
        rows = [{**fixed, **dict(zip(many.over, values, strict=True))} for values in columns]
        return [], self.connection.executemany(many.sql.text, rows).rowcount


def _bound(text: str, params: dict[str, Any]) -> dict[str, Any]:
    """A statement's parameters (sqlite3 reads those it names); a list read by ``json_each`` as JSON."""
    lists = _json_lists(text)
    if not lists:
        return params
    return {**params, **{name: orjson.dumps(params[name]).decode() for name in lists}}


@functools.cache
def _json_lists(text: str) -> tuple[str, ...]:
    """The parameters a statement reads as a list (``json_each(:name)``)."""
    return tuple(_JSON_LIST.findall(text))


_JSON_LIST = re.compile(r"json_each\(:(\w+)\)")


_NOTHING: _Result = ([], 0)


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back what is left of a failed transaction without masking the error that failed it.

    SQLite rolls a transaction back by itself on some errors (a full disk among them), and a ROLLBACK
    then fails with "cannot rollback - no transaction is active", hiding the real cause.
    """
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
