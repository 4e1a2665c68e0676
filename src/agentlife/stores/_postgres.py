"""The PostgreSQL `CheckpointStore`: an asyncpg pool over the schema every store shares.

asyncpg is imported in `PostgresStore.open`, never at module import, so ``import agentlife`` stays light.
Every write after `PostgresStore.claim` is fenced by ``WHERE id = $1 AND attempt = $2``: when a later attempt
owns the row the statement matches nothing, `AttemptFenced` is raised and the row is left untouched.
A checkpoint write is one statement (data-modifying CTEs): one round trip that commits the job row and its
history entry atomically.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from agentlife._exceptions import AttemptFenced, ConfigError, JobNotFound, StoreUnavailable
from agentlife._redact import Redactor, url_password
from agentlife.constants import HydrationConstants
from agentlife.stores._base import (
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
from agentlife.stores._childjobs import PostgresChildOps
from agentlife.stores._events import PostgresEventOps
from agentlife.stores._jobs import expected_statuses
from agentlife.stores._pg_jobs import JOB_COLUMNS, PostgresJobOps
from agentlife.stores._pg_jobs import dumps as _dumps
from agentlife.stores._pg_jobs import loads as _loads
from agentlife.stores._pg_jobs import record as _record
from agentlife.stores._pg_listen import PgListener, notify_call
from agentlife.stores._pg_schema import pg_schema as _schema
from agentlife.stores._pg_statements import HEARTBEAT_AGE, write_checkpoint_sql
from agentlife.stores._steprecords import PostgresStepRecordOps, StepRecord
from agentlife.stores._waits import PostgresWaitOps

__all__ = ["PostgresStore"]

_log = logging.getLogger("agentlife.store")
_HYDRATION = HydrationConstants()
_JOB_COLUMNS = JOB_COLUMNS
#: What a claim makes of the row's status: a runnable row (a parked wait's too) is RUNNING, others stay.
_CLAIMED_STATUS = "CASE WHEN status IN ('PENDING', 'RETRYING', 'WAITING') THEN 'RUNNING' ELSE status END"
_CLOSE_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class _Sql:
    """Every statement, built once from the configured table names."""

    schema: tuple[str, ...]
    get_job: str
    create_job: str
    claim: str
    owner: str
    lock_claim: str
    take_claim: str
    has_owner_column: str
    release: str
    load: str
    history: str
    set_status: str
    fenced_status: str
    lock_usage: str
    write_usage: str
    heartbeat: str
    is_delivered: str
    record_delivery: str
    load_messages: str

    @classmethod
    def build(cls, t: TableNames, *, owner: bool = True) -> _Sql:
        """The statements; without ``owner`` (a database made before the claim token) fenced by attempt."""
        h = t.checkpoint_history

        def fence(n: int) -> str:
            # The claim token is the statement's last parameter, $n; a row without one is fenced by attempt.
            return f" AND (owner IS NULL OR owner = ${n})" if owner else ""

        return cls(
            schema=_schema(t),
            get_job=f"SELECT {_JOB_COLUMNS} FROM {t.job} WHERE id = $1",
            # Wakes the agent's idle workers on commit; an existing row (no insert) wakes nobody.
            create_job=(
                f"WITH created AS (INSERT INTO {t.job}"
                " (id, agent_id, status, payload, attempt, token_budget, updated_at)"
                " VALUES ($1, $2, $3, $4::jsonb, 0, $5::jsonb, now()) ON CONFLICT (id) DO NOTHING"
                f" RETURNING agent_id) SELECT {notify_call(t)} FROM created"
            ),
            # One statement: the row lock serialises concurrent claims, and the WHERE re-checks after a wait.
            claim=(
                f"UPDATE {t.job} SET attempt = $2, updated_at = now(),"
                f" status = {_CLAIMED_STATUS}"
                f" WHERE id = $1 AND attempt <= $2 RETURNING {_JOB_COLUMNS}"
            ),
            owner=f"SELECT attempt FROM {t.job} WHERE id = $1",
            lock_claim=(f"SELECT attempt, owner, {HEARTBEAT_AGE} FROM {t.job} WHERE id = $1 FOR UPDATE"),
            take_claim=(
                f"UPDATE {t.job} SET attempt = $2, owner = $3, heartbeat_at = now(), updated_at = now(),"
                f" status = {_CLAIMED_STATUS}"
                f" WHERE id = $1 RETURNING {_JOB_COLUMNS}"
            ),
            has_owner_column=f"SELECT owner FROM {t.job} LIMIT 0",
            release=f"UPDATE {t.job} SET owner = NULL WHERE id = ANY($1::text[]) AND owner = $2",
            load=f"SELECT checkpoint, checkpoint_crc, checkpoint_id FROM {t.job} WHERE id = $1",
            history=(
                f"SELECT checkpoint_id, checkpoint, crc, step FROM {h} WHERE job_id = $1"
                " ORDER BY created_at DESC, step DESC"
            ),
            # $6: the statuses the write expects to find (never a terminal one unless asked).
            set_status=(
                f"UPDATE {t.job} SET status = $3, result = COALESCE($4::jsonb, result),"
                " error = CASE WHEN $5::jsonb IS NULL THEN error"
                " ELSE COALESCE(error, '[]'::jsonb) || jsonb_build_array($5::jsonb) END,"
                f" updated_at = now() WHERE id = $1 AND attempt = $2 AND status = ANY($6::text[]){fence(7)}"
                " RETURNING 1"
            ),
            fenced_status=f"SELECT status FROM {t.job} WHERE id = $1 AND attempt = $2{fence(3)}",
            lock_usage=(
                f"SELECT tokens_consumed FROM {t.job} WHERE id = $1 AND attempt = $2{fence(3)} FOR UPDATE"
            ),
            write_usage=f"UPDATE {t.job} SET tokens_consumed = $2::jsonb, updated_at = now() WHERE id = $1",
            heartbeat=(
                f"UPDATE {t.job} SET heartbeat_at = now()"
                f" WHERE id = $1 AND attempt = $2{fence(3)} RETURNING 1"
            ),
            is_delivered=f"SELECT 1 FROM {t.delivery} WHERE key = $1",
            record_delivery=(
                f"INSERT INTO {t.delivery} (key, job_id, channel, delivered_at) VALUES ($1, $2, $3, now())"
                " ON CONFLICT (key) DO NOTHING"
            ),
            load_messages=f"SELECT message FROM {t.conversation} WHERE job_id = $1 AND seq < $2 ORDER BY seq",
        )


class PostgresStore(
    PostgresJobOps, PostgresWaitOps, PostgresEventOps, PostgresChildOps, PostgresStepRecordOps
):
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
        self.tables = tables or TableNames()
        self._url = url
        self._display_url, secrets = _redacted_url(url)
        self._redactor = Redactor(secrets)
        self._min_size = min_size
        self._max_size = max_size
        self._warm = min(warm, max_size)
        self._connect_tries = connect_tries
        self._connect_backoff = connect_backoff
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._create_schema = create_schema
        self._sql = _Sql.build(self.tables)
        self._checkpoint_statements: dict[tuple[bool, bool, bool, bool], str] = {}
        #: This process's claim token, written to the row's ``owner`` column at claim.
        self.owner = new_owner()
        self._fence_args: tuple[str, ...] = (self.owner,)
        self._claimed: set[str] = set()
        self._pool: Any = None
        self._unavailable: tuple[type[BaseException], ...] = ()
        self._misuse: tuple[type[BaseException], ...] = ()
        self._undefined_table: type[BaseException] | None = None
        self._broken_session: tuple[type[BaseException], ...] = ()
        self._refused: tuple[type[BaseException], ...] = ()
        self._listener = PgListener(url, self.tables, connect_timeout, self._describe) if listen else None

    def __repr__(self) -> str:
        return f"PostgresStore({self._display_url!r})"

    @property
    def display_url(self) -> str:
        """The URL with its password masked, safe for logs and errors."""
        return self._display_url

    # -- connection ------------------------------------------------------------------------------------

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
                    f"PostgreSQL store {self._display_url} refused the connection: {self._describe(exc)}"
                ) from None
            except (asyncpg.exceptions.ClientConfigurationError, ValueError) as exc:
                raise ConfigError(
                    f"AGENTLIFE_DATABASE_URL {self._display_url} is not usable: {self._describe(exc)}"
                ) from None
            except self._unavailable as exc:
                last = exc
                _log.warning(
                    "PostgreSQL store %s unreachable (try %s/%s): %s",
                    self._display_url,
                    attempt,
                    self._connect_tries,
                    self._describe(exc),
                )
            else:
                break
        if self._pool is None:
            assert last is not None
            raise StoreUnavailable(
                f"PostgreSQL store {self._display_url} unreachable after {self._connect_tries} tries: "
                f"{self._describe(last)}"
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
                self._display_url,
                len(held),
                self._warm,
                self._describe(failures[0]),
            )

    async def _detect_owner_column(self) -> None:
        """Fall back to attempt-only fencing on a job table without ``owner`` (until ``db init`` adds it)."""
        import asyncpg

        try:
            async with self._connection() as conn:
                await conn.execute(self._sql.has_owner_column)
        except asyncpg.exceptions.UndefinedColumnError:
            _log.warning(
                "the %s table has no owner column: claims are fenced by attempt only, "
                "so two processes with the same attempt could both run the job; run "
                "`python -m agentlife db init`",
                self.tables.job,
            )
            self._sql = _Sql.build(self.tables, owner=False)
            self._fence_args = ()
        except (StoreUnavailable, asyncpg.exceptions.PostgresError):
            pass  # no table yet (db init will make it with the column) or an outage the next call reports

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
        )

    async def close(self) -> None:
        """Close the pool gracefully within a few seconds (shielded), else terminate it; idempotent."""
        if self._listener is not None:
            await self._listener.close()
        if self._pool is not None and self._claimed:
            await self._release()
        pool, self._pool = self._pool, None
        if pool is None:
            return
        with anyio.move_on_after(_CLOSE_TIMEOUT_SECONDS, shield=True):
            await pool.close()
        if not pool.is_closing() or pool.get_size():
            pool.terminate()

    async def drop_claim(self, job_id: str) -> None:
        """Clear the row's claim token if it is still this store's (see the protocol)."""
        self._claimed.discard(job_id)
        async with self._connection() as conn:
            await conn.execute(self._sql.release, [job_id], self.owner)

    async def _release(self) -> None:
        """Give up this store's claims: the claim lasts while the store is open, a re-run may take it then.

        Best effort and short: with the server down, the heartbeat's age frees the claim later.
        """
        ids, self._claimed = sorted(self._claimed), set()
        with anyio.move_on_after(1.0, shield=True):
            try:
                async with self._connection() as conn:
                    await conn.execute(self._sql.release, ids, self.owner)
            except Exception as exc:
                _log.info("could not release the claim of %s: %s", ", ".join(ids), self._describe(exc))

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
    async def _connection(self) -> AsyncIterator[Any]:
        pool = self._pool
        if pool is None:
            raise StoreUnavailable(f"PostgreSQL store {self._display_url} is not open")
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
                        f"PostgreSQL store {self._display_url} unavailable: {self._describe(exc)}"
                    ) from None
        except self._unavailable as exc:
            if isinstance(exc, self._misuse):
                raise  # a bug (bad argument type, ...) is not an outage: retrying cannot help
            raise StoreUnavailable(
                f"PostgreSQL store {self._display_url} unavailable: {self._describe(exc)}"
            ) from None
        except self._refused as exc:
            # A new pooled connection refused as `open` is (the database dropped, the password changed).
            raise StoreUnavailable(
                f"PostgreSQL store {self._display_url} refused the connection: {self._describe(exc)}"
            ) from None
        except Exception as exc:
            if self._undefined_table is not None and isinstance(exc, self._undefined_table):
                raise StoreUnavailable(
                    f"PostgreSQL schema missing ({self._describe(exc)}): run `python -m agentlife db init`"
                ) from None
            raise

    def _describe(self, exc: BaseException) -> str:
        text = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
            text = f"timed out ({text})" if str(exc) else "timed out"
        return self._redactor.redact(text)

    async def init_schema(self) -> None:
        """Create the schemas, tables and index that are missing (idempotent, safe to run concurrently)."""
        async with self._connection() as conn, conn.transaction():
            # Concurrent CREATE ... IF NOT EXISTS can still collide in the catalog; serialise them.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('agentlife.init_schema'))")
            for statement in self._sql.schema:
                await conn.execute(statement)

    # -- jobs -----------------------------------------------------------------------------------------

    async def get_job(self, job_id: str) -> JobRecord | None:
        """The job row, or None."""
        async with self._connection() as conn:
            row = await conn.fetchrow(self._sql.get_job, job_id)
        return None if row is None else _record(row)

    async def create_job(
        self, job_id: str, agent_id: str, payload: Any, token_budget: dict[str, Any] | None = None
    ) -> JobRecord:
        """Insert a PENDING job row (no-op returning the row if it exists)."""
        async with self._connection() as conn:
            await conn.execute(
                self._sql.create_job,
                job_id,
                agent_id,
                str(JobStatus.PENDING),
                _dumps(payload),
                _dumps(token_budget),
            )
            row = await conn.fetchrow(self._sql.get_job, job_id)
        return _record(row)

    async def claim(self, job_id: str, attempt: int) -> JobRecord:
        """Take ownership: set ``attempt`` and status RUNNING when ``attempt`` >= the row's.

        Raises:
            JobNotFound: no such row.
            AttemptFenced: the row belongs to a later attempt.
        """
        if not self._fence_args:  # no owner column: the attempt alone decides, in one statement
            async with self._connection() as conn:
                row = await conn.fetchrow(self._sql.claim, job_id, attempt)
                if row is not None:
                    return _record(row)
                owner = await conn.fetchval(self._sql.owner, job_id)
            if owner is None:
                raise JobNotFound(f"job {job_id} does not exist")
            raise AttemptFenced(f"job {job_id} is owned by attempt {owner}, this is {attempt}")
        # The row lock serialises concurrent claims: the second sees the first one's token and loses.
        async with self._connection() as conn, conn.transaction():
            current = await conn.fetchrow(self._sql.lock_claim, job_id)
            if current is None:
                raise JobNotFound(f"job {job_id} does not exist")
            row_attempt, row_owner, age = current
            refusal = claim_refusal(job_id, attempt, row_attempt, row_owner, self.owner, age)
            if refusal is not None:
                raise AttemptFenced(refusal)
            row = await conn.fetchrow(self._sql.take_claim, job_id, attempt, self.owner)
        self._claimed.add(job_id)
        return _record(row)

    # -- checkpoints ----------------------------------------------------------------------------------

    async def load_checkpoint(self, job_id: str) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies, falling back to history; None for a fresh job.

        Raises:
            JobNotFound: no such row.
            CheckpointCorrupt: a checkpoint exists but neither it nor any history entry verifies.
        """
        async with self._connection() as conn:
            row = await conn.fetchrow(self._sql.load, job_id)
            if row is None:
                raise JobNotFound(f"job {job_id} does not exist")
            data, crc, checkpoint_id = row
            if data is None:
                return None
            if crc32(data) == crc:
                return LoadedCheckpoint(checkpoint_id, bytes(data), crc, "job")
            history = await conn.fetch(self._sql.history, job_id)
        return first_valid_checkpoint(job_id, [tuple(entry) for entry in history])

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
        """Store ``data`` exactly, with its CRC-32, and append it to history; returns the CRC.

        ``messages`` (the conversation's new rows), ``usage`` (the step's model calls, added to
        ``tokens_consumed``), ``records`` (step records of this process's session) and the removal of the
        step records before ``prune_before`` are done by the same statement, which also sets
        ``heartbeat_at``: one round trip, one commit.

        Raises:
            AttemptFenced: a later attempt owns the job; nothing was written.
            StoreUnavailable: the server could not be reached (the runtime may retry within its step budget).
        """
        crc = crc32(data)
        spent = usage or StepUsage()
        args: list[Any] = [
            job_id,
            attempt,
            data,
            crc,
            checkpoint_id,
            step,
            spent.input_tokens,
            spent.output_tokens,
            spent.cost_usd,
        ]
        if messages:
            args += ([seq for seq, _ in messages], [message for _, message in messages])
        if records:
            args += (
                records[0].session,
                [r.step for r in records],
                [r.seq for r in records],
                [r.data for r in records],
            )
        if prune_before is not None:
            args.append(prune_before)
        sql = self._checkpoint_sql(bool(messages), bool(records), prune_before is not None)
        async with self._connection() as conn:
            written = await conn.fetchval(sql, *args, *self._fence_args)
        if not written:
            raise AttemptFenced(
                f"job {job_id}: write by attempt {attempt} refused, a later attempt owns the row"
            )
        return crc

    def _checkpoint_sql(self, messages: bool, records: bool, prune: bool) -> str:
        """The checkpoint statement for what this write carries (built once per shape)."""
        key = (bool(self._fence_args), messages, records, prune)
        sql = self._checkpoint_statements.get(key)
        if sql is None:
            sql = self._checkpoint_statements[key] = write_checkpoint_sql(
                self.tables, owner=key[0], conversation=messages, records=records, prune=prune
            )
        return sql

    async def load_conversation(self, job_id: str, length: int) -> list[bytes]:
        """The first ``length`` stored conversation messages of the job, in order."""
        async with self._connection() as conn:
            rows = await conn.fetch(self._sql.load_messages, job_id, length)
        return [bytes(row[0]) for row in rows]

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
        """Record a status (and result, or a crash record appended to ``error``) if the row is as expected."""
        async with self._connection() as conn:
            updated = await conn.fetchval(
                self._sql.set_status,
                job_id,
                attempt,
                str(status),
                _dumps(result),
                _dumps(error),
                list(expected_statuses(expect)),
                *self._fence_args,
            )
            if updated is None:
                found = await conn.fetchval(self._sql.fenced_status, job_id, attempt, *self._fence_args)
        if updated is None:
            if found is not None:
                raise AttemptFenced(
                    f"job {job_id}: {status} by attempt {attempt} refused: the row is {found}"
                )
            raise AttemptFenced(f"job {job_id}: status write by attempt {attempt} refused")

    async def add_usage(
        self, job_id: str, attempt: int, input_tokens: int, output_tokens: int, cost_usd: float
    ) -> dict[str, Any]:
        """Add to ``tokens_consumed`` and return the new totals."""
        async with self._connection() as conn, conn.transaction():
            row = await conn.fetchrow(self._sql.lock_usage, job_id, attempt, *self._fence_args)
            if row is None:
                raise AttemptFenced(f"job {job_id}: usage write by attempt {attempt} refused")
            totals = add_usage_totals(_loads(row[0]) or {}, input_tokens, output_tokens, cost_usd)
            await conn.execute(self._sql.write_usage, job_id, _dumps(totals))
        return totals

    async def heartbeat(self, job_id: str, attempt: int) -> None:
        """Set ``heartbeat_at`` to the server's now()."""
        async with self._connection() as conn:
            beat = await conn.fetchval(self._sql.heartbeat, job_id, attempt, *self._fence_args)
        if beat is None:
            raise AttemptFenced(
                f"job {job_id}: heartbeat by attempt {attempt} refused, a later attempt owns the row"
            )

    # -- delivery registry ----------------------------------------------------------------------------

    async def is_delivered(self, key: str) -> bool:
        """Whether the delivery registry holds ``key``."""
        async with self._connection() as conn:
            return await conn.fetchval(self._sql.is_delivered, key) is not None

    async def record_delivery(self, key: str, job_id: str, channel: str) -> None:
        """Record ``key`` as delivered (idempotent)."""
        async with self._connection() as conn:
            await conn.execute(self._sql.record_delivery, key, job_id, channel)


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
