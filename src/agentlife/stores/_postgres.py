"""The PostgreSQL store: `PostgresStore`, an asyncpg pool over the schema every store shares.

asyncpg is imported in `PostgresDatabase.open`, never at module import, so ``import agentlife`` stays light.
Each operation takes a pooled connection for its statements (`PostgresDatabase.run`); one that must not race
runs in a transaction and locks its rows ``FOR UPDATE``. Every write after a claim is fenced by the attempt
and the claim token: when a later attempt owns the row the statement matches nothing, `AttemptFenced` is
raised and the row is left untouched. A checkpoint write is one statement (data-modifying CTEs): one round
trip that commits the job row and its history entry atomically.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import anyio

from agentlife._exceptions import ConfigError, StoreError, StoreUnavailable
from agentlife._redact import Redactor, url_password
from agentlife.constants import HydrationConstants
from agentlife.stores._base import JobRecord, TableNames
from agentlife.stores._claims import Claimed
from agentlife.stores._dialect import RUNNABLE_SQL, Op, P, Row, SlotTaken, Sql, Statement, Statements, Tx
from agentlife.stores._output_watch import OutputWatch
from agentlife.stores._pg_listen import PgListener
from agentlife.stores._pg_output_listen import PgOutputListener
from agentlife.stores._pg_schema import pg_schema
from agentlife.stores._pg_statements import SECONDS_TO_NEXT_DUE, end_channel_prefix, pg_job, pg_statements
from agentlife.stores._store import SQLStore

__all__ = ["PostgresStore"]

T = TypeVar("T")
_log = logging.getLogger("agentlife.store")
_HYDRATION = HydrationConstants()
_CLOSE_TIMEOUT_SECONDS = 5.0
#: Wake this long after a timer's time, so that the claim that follows finds the row due.
_DUE_MARGIN_SECONDS = 0.02
#: How long the next due time a fruitless claim returned stands in for asking again.
_DUE_HINT_SECONDS = 0.5


class PostgresStore(SQLStore["PostgresDatabase"]):
    """`CheckpointStore` over PostgreSQL (``postgresql://user:password@host:port/db``), via an asyncpg pool.

    Args:
        url: the connection URL (``AGENTLIFE_DATABASE_URL``); its password never appears in errors or logs.
        tables: table names, for an existing control-plane schema (``schema.table`` allowed).
        min_size: connections the pool keeps open (and re-opens in the background after a failure).
        max_size: the most connections the pool opens.
        connect_tries: how many times `open` tries to connect before `StoreUnavailable`.
        connect_backoff: seconds between those tries.
        connect_timeout: seconds one connection attempt may take.
        command_timeout: seconds one statement (or waiting for a free pooled connection) may take before the
            operation fails with `StoreUnavailable`; None for no limit.
        create_schema: run `init_schema` in `open`. Off by default: on PostgreSQL the schema belongs to
            ``python -m agentlife db init`` or to the control plane, and a pod need not hold DDL rights.
        listen: `wait_for_work` waits on a dedicated ``LISTEN`` connection (one more per idle worker) and
            returns as soon as a job is made runnable; False to only sleep (e.g. behind a transaction-mode
            connection pooler, where ``LISTEN`` does not work).
        warm: how many connections `open` opens at once (up to ``max_size``), best effort: a worker opens
            one per slot at boot, so its first jobs' statements do not each start a session (a few
            milliseconds of the server's time: authentication, a backend, its catalog caches). One that
            cannot be opened now (``max_connections`` reached) is logged and opened when needed instead.
    """

    url_scheme = "postgresql"

    def __init__(
        self,
        url: str,
        *,
        tables: TableNames | None = None,
        min_size: int = 1,
        max_size: int = 4,
        connect_tries: int = _HYDRATION.checkpoint_tries,
        connect_backoff: float = _HYDRATION.checkpoint_backoff_seconds,
        connect_timeout: float = _HYDRATION.store_connect_timeout_seconds,
        command_timeout: float | None = 10.0,
        create_schema: bool = False,
        listen: bool = True,
        warm: int = 0,
    ) -> None:
        if not (0 <= min_size <= max_size and max_size >= 1):
            raise ConfigError(
                f"PostgreSQL pool sizes must satisfy 0 <= min_size <= max_size >= 1, got "
                f"min_size={min_size}, max_size={max_size}"
            )
        if connect_tries < 1 or connect_backoff < 0 or connect_timeout <= 0:
            raise ConfigError(
                f"PostgreSQL connect_tries={connect_tries} must be >= 1, connect_backoff="
                f"{connect_backoff:g} >= 0 and connect_timeout={connect_timeout:g} > 0"
            )
        tables = tables or TableNames()
        db = PostgresDatabase(
            url,
            tables,
            min_size=min_size,
            max_size=max_size,
            warm=min(warm, max_size),
            connect_tries=connect_tries,
            connect_backoff=connect_backoff,
            connect_timeout=connect_timeout,
            command_timeout=command_timeout,
            create_schema=create_schema,
        )
        listener = PgListener(url, tables, connect_timeout, db.describe) if listen else None
        self._listening = (url, tables, connect_timeout, db.describe)
        super().__init__(db, tables, signal=None if listener is None else Listening(db, listener))
        self._followers = PgOutputListener(url, tables, connect_timeout, db.describe)

    def output_watch(self, job_id: str) -> OutputWatch:
        """A watch of ``job_id``'s output, woken by ``NOTIFY`` (one connection for all of this store's)."""
        return self._followers.watch(job_id)

    async def close(self) -> None:
        """Close the followers' connection, then as `SQLStore.close`."""
        await self._followers.close()
        await super().close()

    def __repr__(self) -> str:
        return f"PostgresStore({self._db.display_url!r})"

    @property
    def display_url(self) -> str:
        """The URL with its password masked, safe for logs and errors."""
        return self._db.display_url

    def end_listener(self) -> PgListener:
        """A new ``LISTEN`` connection (opened on its first wait) woken by the ends of jobs, keyed by job id.

        Fed by the trigger ``db init`` makes; on a database without it, its waits only time out, so
        every caller keeps polling at its timeout.
        """
        url, tables, connect_timeout, describe = self._listening
        prefix = end_channel_prefix(tables)
        return PgListener(url, tables, connect_timeout, describe, prefix=prefix, waiters="result() waits")


class PostgresDatabase:
    """The `Database` of a `PostgresStore`: its pool, its statements, and the runner of operations."""

    def __init__(
        self,
        url: str,
        tables: TableNames,
        *,
        min_size: int,
        max_size: int,
        warm: int,
        connect_tries: int,
        connect_backoff: float,
        connect_timeout: float,
        command_timeout: float | None,
        create_schema: bool,
    ) -> None:
        self.tables = tables
        self._url = url
        self.display_url, secrets = _redacted_url(url)
        self._redactor = Redactor(secrets)
        self._min_size = min_size
        self._max_size = max_size
        self._warm = warm
        self._connect_tries = connect_tries
        self._connect_backoff = connect_backoff
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._create_schema = create_schema
        self.sql: Statements = pg_statements(tables)
        self._pool: Any = None
        self._unavailable: tuple[type[BaseException], ...] = ()
        self._misuse: tuple[type[BaseException], ...] = ()
        self._undefined_table: type[BaseException] | None = None
        self._undefined_column: type[BaseException] | None = None
        self._broken_session: tuple[type[BaseException], ...] = ()
        self._refused: tuple[type[BaseException], ...] = ()

    @property
    def is_open(self) -> bool:
        """Whether the pool is open."""
        return self._pool is not None

    async def run(self, op: Op[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``op`` on a pooled connection."""
        async with self._ops() as conn:
            return await op(PgTx(conn, self.sql), *args, **kwargs)

    async def open(self) -> None:
        """Create the pool, trying ``connect_tries`` times ``connect_backoff`` seconds apart.

        Raises:
            StoreUnavailable: the server could not be reached (or refused us) on every try.
            ConfigError: the URL cannot be parsed.
        """
        if self._pool is not None:
            return
        import asyncpg  # type: ignore[import-untyped]  # heavy: only when PostgreSQL is used

        self._unavailable = _unavailable_errors(asyncpg)
        e = asyncpg.exceptions
        self._misuse = (e.DataError, e.ClientConfigurationError, e.UnsupportedClientFeatureError)
        self._undefined_table = asyncpg.exceptions.UndefinedTableError
        self._undefined_column = asyncpg.exceptions.UndefinedColumnError
        self._broken_session = (asyncpg.exceptions.InternalClientError,)
        # Credentials or a missing database will not fix themselves: fail at once instead of retrying.
        permanent = (
            asyncpg.exceptions.InvalidAuthorizationSpecificationError,
            asyncpg.exceptions.InvalidCatalogNameError,
        )
        self._refused = permanent
        last: BaseException | None = None
        for attempt in range(1, self._connect_tries + 1):
            if attempt > 1:
                await anyio.sleep(self._connect_backoff)
            try:
                self._pool = await self._create_pool(asyncpg)
            except permanent as exc:
                raise StoreUnavailable(
                    f"PostgreSQL store {self.display_url} refused the connection: {self.describe(exc)}"
                ) from None
            except (asyncpg.exceptions.ClientConfigurationError, ValueError) as exc:
                raise ConfigError(
                    f"AGENTLIFE_DATABASE_URL {self.display_url} is not usable: {self.describe(exc)}"
                ) from None
            except self._unavailable as exc:
                last = exc
                _log.warning(
                    "PostgreSQL store %s unreachable (try %s/%s): %s",
                    self.display_url,
                    attempt,
                    self._connect_tries,
                    self.describe(exc),
                )
            else:
                break
        if self._pool is None:
            assert last is not None
            raise StoreUnavailable(
                f"PostgreSQL store {self.display_url} unreachable after {self._connect_tries} tries: "
                f"{self.describe(last)}"
            ) from None
        if self._create_schema:
            await self.init_schema()
        await self._detect_owner_column()
        await self._open_warm_connections()

    async def _open_warm_connections(self) -> None:
        """Hold ``warm`` pooled connections at once (opening those missing), then hand them back."""
        pool, held, failures = self._pool, [], []

        async def take() -> None:
            try:
                held.append(await pool.acquire(timeout=self._connect_timeout))
            except Exception as exc:  # best effort: the pool opens it when a statement needs it
                failures.append(exc)

        async with anyio.create_task_group() as tasks:
            for _ in range(self._warm):
                tasks.start_soon(take)
        for conn in held:
            await pool.release(conn)
        if failures:
            _log.warning(
                "PostgreSQL store %s: opened %s of %s connections at once (%s); the rest open when needed",
                self.display_url,
                len(held),
                self._warm,
                self.describe(failures[0]),
            )

    async def _detect_owner_column(self) -> None:
        """Fall back to attempt-only fencing on a job table without ``owner`` (until ``db init`` adds it)."""
        import asyncpg

        try:
            async with self._connection() as conn:
                await conn.execute(f"SELECT owner FROM {self.tables.job} LIMIT 0")
        except asyncpg.exceptions.UndefinedColumnError:
            _log.warning(
                "the %s table has no owner column: claims are fenced by attempt only, "
                "so two processes with the same attempt could both run the job; run "
                "`python -m agentlife db init`",
                self.tables.job,
            )
            self.sql = pg_statements(self.tables, owner=False, keys=False)
        except (StoreUnavailable, asyncpg.exceptions.PostgresError):
            pass  # no table yet (db init will make it with the column) or an outage the next call reports
        else:
            await self._detect_key_columns()

    async def _detect_key_columns(self) -> None:
        """A job table from before concurrency keys or pauses: jobs use it as before until ``db init``."""
        import asyncpg

        try:
            async with self._connection() as conn:
                await conn.execute(
                    f"SELECT concurrency_key, priority, key_slot, paused, incarnation"
                    f" FROM {self.tables.job} LIMIT 0"
                )
        except asyncpg.exceptions.UndefinedColumnError:
            _log.warning(
                "the %s table has no concurrency keys yet: run `python -m agentlife db init`", self.tables.job
            )
            self.sql = pg_statements(self.tables, keys=False)
        except (StoreUnavailable, asyncpg.exceptions.PostgresError):
            pass

    async def _create_pool(self, asyncpg: Any) -> Any:
        return await asyncpg.create_pool(
            self._url,
            min_size=self._min_size,
            max_size=self._max_size,
            timeout=self._connect_timeout,
            command_timeout=self._command_timeout,
            # A pod runs one job: keep its connections rather than churning them.
            max_inactive_connection_lifetime=0,
            reset=_keep_session,
            init=_read_any_timestamp,
        )

    async def close(self) -> None:
        """Close the pool gracefully within a few seconds (shielded), else terminate it; idempotent."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        with anyio.move_on_after(_CLOSE_TIMEOUT_SECONDS, shield=True):
            await pool.close()
        if not pool.is_closing() or pool.get_size():
            pool.terminate()

    def has_free_connection(self) -> bool:
        """True while the pool could hand out a connection now; safe to call from another thread.

        A pooled connection is free when it is idle, and a pool below ``max_size`` can open another.
        """
        pool = self._pool
        if pool is None:
            return False
        try:
            return bool(pool.get_idle_size() > 0 or pool.get_size() < pool.get_max_size())
        except Exception:  # the probe must answer even if the pool changes under it
            return False

    @contextlib.asynccontextmanager
    async def _ops(self) -> AsyncIterator[Any]:
        """A pooled connection for one operation; a table without a column it names asks for ``db init``."""
        try:
            async with self._connection() as conn:
                yield conn
        except Exception as exc:
            if self._undefined_column is not None and isinstance(exc, self._undefined_column):
                raise StoreUnavailable(
                    f"the {self.tables.job} table predates job operations ({exc}): "
                    "run `python -m agentlife db init`"
                ) from None
            raise

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Any]:
        pool = self._pool
        if pool is None:
            raise StoreUnavailable(f"PostgreSQL store {self.display_url} is not open")
        try:
            async with pool.acquire(timeout=self._command_timeout) as conn:
                try:
                    yield conn
                except anyio.get_cancelled_exc_class():
                    # A cancelled statement leaves the session mid-query or mid-transaction, and every await
                    # of asyncpg's own cleanup would be cancelled again: drop the connection instead (the
                    # server rolls back) and let the pool open a fresh one when it is next needed.
                    conn.terminate()
                    raise
                except self._broken_session as exc:
                    # A session the server cut mid-use (shutdown, failover) can leave asyncpg's protocol in an
                    # impossible state ("cannot switch to state N; another operation is in progress"): that
                    # connection is unusable, the server may well not be. Drop it; the caller may retry.
                    conn.terminate()
                    raise StoreUnavailable(
                        f"PostgreSQL store {self.display_url} unavailable: {self.describe(exc)}"
                    ) from None
        except self._misuse as exc:
            # Not an outage: retrying cannot help. A value PostgreSQL cannot hold (an attempt at the top of
            # its integer, written by another client) is one line, not an internal error.
            message = f"PostgreSQL store {self.display_url} refused a value: {self.describe(exc)}"
            raise StoreError(message) from None
        except self._unavailable as exc:
            raise StoreUnavailable(
                f"PostgreSQL store {self.display_url} unavailable: {self.describe(exc)}"
            ) from None
        except self._refused as exc:
            # A new pooled connection refused as `open` is (the database dropped, the password changed).
            raise StoreUnavailable(
                f"PostgreSQL store {self.display_url} refused the connection: {self.describe(exc)}"
            ) from None
        except Exception as exc:
            if self._undefined_table is not None and isinstance(exc, self._undefined_table):
                raise StoreUnavailable(
                    f"PostgreSQL schema missing ({self.describe(exc)}): run `python -m agentlife db init`"
                ) from None
            raise

    def describe(self, exc: BaseException) -> str:
        """An error's text on one line, with the URL's secrets masked."""
        text = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
            text = f"timed out ({text})" if str(exc) else "timed out"
        return self._redactor.redact(text)

    async def init_schema(self) -> None:
        """Create the schemas, tables and index that are missing (idempotent, safe to run concurrently)."""
        async with self._connection() as conn, conn.transaction():
            # Concurrent CREATE ... IF NOT EXISTS can still collide in the catalog; serialise them.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('agentlife.init_schema'))")
            for statement in pg_schema(self.tables):
                await conn.execute(statement)


class PgTx:
    """The `Tx` of one PostgreSQL operation: its pooled connection."""

    def __init__(self, conn: Any, sql: Statements) -> None:
        self._conn = conn
        self.sql = sql
        self.now = time.time()

    def atomic(self) -> AbstractAsyncContextManager[object]:
        """A transaction block (``BEGIN`` ... ``COMMIT``): rows locked ``FOR UPDATE`` stay so to its end."""
        transaction: AbstractAsyncContextManager[object] = self._conn.transaction()
        return transaction

    def job(self, row: Row) -> JobRecord:
        """A job row read as `pg_statements` select it."""
        return pg_job(row)

    async def fetch(self, statement: Statement, **params: Any) -> Sequence[Row]:
        """Every row the statement returns."""
        sql = _one(statement)
        rows: Sequence[Row] = await self._conn.fetch(sql.text, *sql.values(params))
        return rows

    async def fetchrow(self, statement: Statement, **params: Any) -> Row | None:
        """The first row the statement returns, or None."""
        sql = _one(statement)
        try:
            row: Row | None = await self._conn.fetchrow(sql.text, *sql.values(params))
        except Exception as exc:
            if _slot_taken(exc):
                raise SlotTaken(str(exc)) from None
            raise
        return row

    async def fetchval(self, statement: Statement, **params: Any) -> Any:
        """The first column of the first row, or None."""
        sql = _one(statement)
        return await self._conn.fetchval(sql.text, *sql.values(params))

    async def execute(self, statement: Statement, **params: Any) -> int:
        """How many rows the statement changed (or returned): the count of its command tag."""
        sql = _one(statement)
        tag: str = await self._conn.execute(sql.text, *sql.values(params))
        count = tag.rpartition(" ")[2]
        return int(count) if count.isdigit() else 0


def _one(statement: Statement) -> Sql:
    # PostgreSQL writes every statement as one: the composite forms are for databases that cannot.
    assert isinstance(statement, Sql), statement
    return statement


class Listening:
    """The `WorkSignal` of a `PostgresStore`: a ``LISTEN`` connection, and the timers of rows not yet due.

    A write that makes a job runnable now notifies; nothing notifies when a timer comes due (a sleep's end, a
    backoff's), so the wait is bounded by the agent's next row not yet due.
    """

    notifies = True

    def __init__(self, db: PostgresDatabase, listener: PgListener) -> None:
        self._db = db
        self._listener = listener
        self._next_due = Sql.numbered(
            f"SELECT {SECONDS_TO_NEXT_DUE} FROM {db.tables.job}"
            f" WHERE agent_id = :agent_id AND {RUNNABLE_SQL} AND not_before > now()"
        )
        #: What the last fruitless claim learnt: (agent id, monotonic time, seconds until its next due row).
        self._due_hint: tuple[str, float, float | None] | None = None

    async def wait(self, agent_id: str, timeout: float) -> bool:
        """Wait on the ``LISTEN`` connection for a job of ``agent_id`` to become runnable.

        True when notified (also right after the connection was opened, or re-opened, since notifications
        sent before then are lost: claim once), False at ``timeout``. Never raises (but for cancellation): a
        dropped or refused connection is logged once and the wait sleeps; a later call connects again.
        """
        if not self._db.is_open:  # closed: no connection to leave behind
            await anyio.sleep(timeout)
            return False
        due = await self._next_due_in(agent_id)
        if due is not None and due < timeout:
            # No statement notifies when a timer comes due: wake for it (a sleep's end, a backoff's).
            await self._listener.wait(agent_id, due + _DUE_MARGIN_SECONDS)
            return True
        return await self._listener.wait(agent_id, timeout)

    def claimed(self, agent_id: str | None, claim: Claimed) -> None:
        """Remember when the agent's next row comes due, if the claim that found nothing said."""
        known = agent_id is not None and claim.row is None and claim.due_known
        self._due_hint = (agent_id, time.monotonic(), claim.next_due) if known and agent_id else None

    async def _next_due_in(self, agent_id: str) -> float | None:
        """Seconds until the next row of ``agent_id`` not yet due comes due; None if none or unknown.

        Taken from the claim that just found nothing when there was one (the worker's idle loop claims, then
        waits), so that an idle wait costs no statement of its own; asked of the server otherwise.
        """
        hint, self._due_hint = self._due_hint, None
        if hint is not None and hint[0] == agent_id:
            age = time.monotonic() - hint[1]
            if 0 <= age < _DUE_HINT_SECONDS:
                return None if hint[2] is None else max(hint[2] - age, 0.0)
        try:
            due = await self._db.run(_value, self._next_due, agent_id=agent_id)
        except Exception as exc:  # the fallback poll still finds it: never fail the idle wait
            _log.debug("next due time of %s unknown: %s", agent_id, type(exc).__name__)
            return None
        return None if due is None else max(float(due), 0.0)

    async def close(self) -> None:
        """Close the ``LISTEN`` connection (a later `wait` opens it again)."""
        await self._listener.close()


async def _value(tx: Tx, statement: Statement, /, **params: Any) -> Any:
    return await tx.fetchval(statement, **params)


async def _read_any_timestamp(conn: Any) -> None:
    """Read every ``timestamptz`` PostgreSQL holds: one past a datetime's years (1 to 9999) as infinity.

    asyncpg's own decoder raises ``OverflowError`` on ``'294276-01-01'`` or ``'4713-01-01 BC'`` (a row
    another client wrote), and that made every read of the table fail, ``job list`` too. Here such a time
    reads as PostgreSQL's infinity does (the naive ``datetime.max`` or ``datetime.min``, see `unix`).
    """
    await conn.set_type_codec(
        "timestamptz", schema="pg_catalog", encoder=_timestamp_out, decoder=_timestamp_in, format="tuple"
    )


#: How PostgreSQL sends a timestamp: microseconds since 2000-01-01 UTC, its infinities at the int64 ends.
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_PG_INFINITY, _PG_MINUS_INFINITY = 2**63 - 1, -(2**63)
_MICROSECOND = timedelta(microseconds=1)


def _timestamp_in(value: tuple[int]) -> datetime:
    (micros,) = value
    try:
        if _PG_MINUS_INFINITY < micros < _PG_INFINITY:
            return _PG_EPOCH + micros * _MICROSECOND
    except OverflowError:
        pass
    return datetime.max if micros > 0 else datetime.min


def _timestamp_out(value: datetime) -> tuple[int]:
    if value.tzinfo is None:  # the naive ends are PostgreSQL's infinities, as asyncpg writes them
        if value == datetime.max:
            return (_PG_INFINITY,)
        if value == datetime.min:
            return (_PG_MINUS_INFINITY,)
        value = value.replace(tzinfo=UTC)
    return ((value - _PG_EPOCH) // _MICROSECOND,)


async def _keep_session(conn: Any) -> None:
    """Skip the pool's reset query on release: a whole extra round trip per operation.

    asyncpg still rolls back a transaction left open (e.g. by cancellation) before calling this. The query it
    skips (``RESET ALL``, ``UNLISTEN *``, ``CLOSE ALL``, advisory unlock) undoes session state that this store
    never creates: no SET, LISTEN, cursors or session-level advisory locks.
    """


def _unavailable_errors(asyncpg: Any) -> tuple[type[BaseException], ...]:
    """Errors that mean "the server is not reachable right now", as opposed to a bug or a refused write."""
    e = asyncpg.exceptions
    return (
        OSError,  # refused, reset, unreachable
        TimeoutError,  # connect, command or pool-acquire timeout (asyncio.TimeoutError is TimeoutError)
        e.PostgresConnectionError,  # class 08, incl. "connection was closed in the middle of operation"
        e.OperatorInterventionError,  # class 57: admin/crash shutdown, cannot connect now, query cancelled
        e.InsufficientResourcesError,  # class 53: too many connections, disk full
        e.InterfaceError,  # "connection is closed", "pool is closing"
    )


def _redacted_url(url: str) -> tuple[str, list[str]]:
    """``url`` with the password masked (userinfo and ``password=`` query), and the secrets found.

    The userinfo password is found by `url_password`, not `urllib.parse`: an unencoded ``#`` or ``?`` in it
    would end the netloc there and leave the rest of the password in the "fragment" for all to see.
    """
    secrets: list[str] = []
    password = url_password(url)
    if password:
        secrets += [password, urllib.parse.unquote(password)]
    try:
        query = urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query, keep_blank_values=True)
    except ValueError:
        query = []
    secrets += [value for key, value in query if key.lower() in ("password", "sslpassword")]
    secrets = [s for s in secrets if s]
    shown = url
    for secret in sorted(set(secrets), key=len, reverse=True):
        shown = shown.replace(secret, "***")
    return Redactor().redact(shown), secrets


def _slot_taken(exc: BaseException) -> bool:
    """Whether ``exc`` is the unique index of the RUNNING rows' slots refusing a concurrent claim's slot."""
    constraint = getattr(exc, "constraint_name", None) or ""
    return type(exc).__name__ == "UniqueViolationError" and constraint.endswith("_slot_idx")
