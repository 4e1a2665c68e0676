"""Job operations of `PostgresStore`: claim, list, approve / reject / cancel / retry, and the reaper.

The claim is one statement: the oldest runnable row, found through a partial index on ``not_before`` and
locked ``FOR UPDATE SKIP LOCKED`` so concurrent claimers each get a different row, updated in the same
statement. Approve, reject, cancel and retry are each one conditional UPDATE (``WHERE status = ANY(...)``):
of two racing on a row, the second matches nothing and reports the status the first one left. The reaper
locks each stale row with ``SKIP LOCKED`` and updates it only if it is still RUNNING with the same attempt.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from agentlife._exceptions import StoreUnavailable
from agentlife.constants import Constants
from agentlife.stores._base import JobRecord, JobStatus, TableNames, owner_is_gone
from agentlife.stores._jobs import (
    APPROVABLE,
    CANCELLABLE,
    RETRYABLE,
    RUNNABLE,
    SET_ASIDE_PER_CLAIM,
    ReapDecision,
    check_releasable,
    conflict,
    crash_count,
    decide_reap,
    operator_record,
    retry_marker,
)
from agentlife.stores._rows import (
    JSON_COLUMNS,
    SET_ASIDE_STATUS,
    decode_histories,
    job_record,
    log_set_aside,
    set_aside_entry,
)

__all__ = ["JOB_COLUMNS", "PostgresJobOps", "dumps", "loads", "pg_job_schema", "record", "unix"]

JOB_COLUMNS = (
    "id, agent_id, status, payload, attempt, checkpoint_id, checkpoint_crc, heartbeat_at, tokens_consumed,"
    " token_budget, error, result, updated_at"
)
_COLUMNS = f"{JOB_COLUMNS}, not_before"
_RUNNABLE = f"status IN ({', '.join(repr(str(s)) for s in RUNNABLE)})"
_DUE = "(not_before IS NULL OR not_before <= now())"


def pg_job_schema(t: TableNames) -> tuple[str, ...]:
    """The ``not_before`` column (added to a 0.2 table too) and the indexes of the runnable-job lookup."""
    base = t.job.split(".")[-1]
    return (
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS not_before timestamptz DEFAULT now()",
        f"CREATE INDEX IF NOT EXISTS {base}_runnable_idx ON {t.job} (not_before NULLS FIRST, id)"
        f" WHERE {_RUNNABLE}",
        f"CREATE INDEX IF NOT EXISTS {base}_agent_runnable_idx ON {t.job}"
        f" (agent_id, not_before NULLS FIRST, id) WHERE {_RUNNABLE}",
    )


@dataclass(frozen=True, slots=True)
class _JobSql:
    claim_any: str
    claim_agent: str
    get: str
    list: str
    count_runnable: str
    approve: str
    operate: str
    server_now: str
    stale: str
    lock_stale: str
    owned_here: str
    lock_owned: str
    agent_errors: str
    reap: str
    release: str
    set_aside: str

    @classmethod
    def build(cls, t: TableNames) -> _JobSql:
        j = t.job

        def claim(agent: str) -> str:
            return (
                f"WITH next AS (SELECT id AS next_id FROM {j} WHERE {agent}{_RUNNABLE} AND {_DUE}"
                " ORDER BY not_before NULLS FIRST, id LIMIT 1 FOR UPDATE SKIP LOCKED)"
                f" UPDATE {j} SET status = 'RUNNING', attempt = attempt + 1, owner = $1,"
                " heartbeat_at = now(), updated_at = now()"
                f" FROM next WHERE id = next.next_id RETURNING {_COLUMNS}"
            )

        # The appended entry gets the row's attempt as it was before this statement.
        append = (
            "error = COALESCE(error, '[]'::jsonb) || jsonb_build_array($2::jsonb"
            " || jsonb_build_object('attempt', attempt))"
        )
        return cls(
            claim_any=claim(""),
            claim_agent=claim("agent_id = $2 AND "),
            get=f"SELECT {_COLUMNS} FROM {j} WHERE id = $1",
            list=(
                f"SELECT {_COLUMNS} FROM {j} WHERE ($1::text IS NULL OR status = $1)"
                " AND ($2::text IS NULL OR agent_id = $2) ORDER BY updated_at DESC, id LIMIT $3"
            ),
            count_runnable=(
                f"SELECT agent_id, count(*) FROM {j} WHERE {_RUNNABLE} AND {_DUE} GROUP BY agent_id"
            ),
            approve=(
                f"UPDATE {j} SET status = CASE WHEN owner IS NOT NULL"
                " AND heartbeat_at > now() - make_interval(secs => $2) THEN 'RUNNING' ELSE 'PENDING' END,"
                " not_before = now(), updated_at = now()"
                f" WHERE id = $1 AND status = ANY($3::text[]) RETURNING {_COLUMNS}"
            ),
            # $4: the SET clause's extra assignments are fixed per operation (see `_OPERATIONS`).
            operate=(
                f"UPDATE {j} SET status = $4, {append}, updated_at = now(),"
                " attempt = attempt + $5, owner = CASE WHEN $6 OR $5 > 0 THEN NULL ELSE owner END,"
                " not_before = CASE WHEN $6 THEN now() ELSE not_before END"
                f" WHERE id = $1 AND status = ANY($3::text[]) RETURNING {_COLUMNS}"
            ),
            server_now="SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8",
            stale=(
                f"SELECT id FROM {j} WHERE status = 'RUNNING'"
                " AND COALESCE(heartbeat_at, updated_at) < to_timestamp($1) ORDER BY id"
            ),
            lock_stale=(
                f"SELECT {_COLUMNS} FROM {j} WHERE id = $1 AND status = 'RUNNING'"
                " AND COALESCE(heartbeat_at, updated_at) < to_timestamp($2) FOR UPDATE SKIP LOCKED"
            ),
            owned_here=f"SELECT id, owner FROM {j} WHERE status = 'RUNNING' AND owner LIKE $1 ORDER BY id",
            lock_owned=(
                f"SELECT {_COLUMNS} FROM {j} WHERE id = $1 AND status = 'RUNNING' AND owner = $2"
                " FOR UPDATE SKIP LOCKED"
            ),
            agent_errors=f"SELECT error FROM {j} WHERE agent_id = $1 AND updated_at >= to_timestamp($2)",
            reap=(
                f"UPDATE {j} SET status = $3, attempt = attempt + 1, owner = NULL,"
                " not_before = to_timestamp($4), updated_at = to_timestamp($5),"
                " error = COALESCE(error, '[]'::jsonb) || jsonb_build_array($6::jsonb)"
                " WHERE id = $1 AND status = 'RUNNING' AND attempt = $2 RETURNING 1"
            ),
            release=(
                f"UPDATE {j} SET status = $3, owner = NULL, not_before = now() + make_interval(secs => $4),"
                " updated_at = now() WHERE id = $1 AND attempt = $2 AND status = 'RUNNING' RETURNING 1"
            ),
            # Appended in jsonb, so a history agentlife cannot read is kept as it is (a non-array becomes the
            # first element).
            set_aside=(
                f"UPDATE {j} SET status = '{SET_ASIDE_STATUS}', owner = NULL, updated_at = now(),"
                " error = COALESCE(error, '[]'::jsonb) || jsonb_build_array($4::jsonb)"
                " WHERE id = $1 AND attempt = $2 AND owner = $3 AND status = 'RUNNING'"
            ),
        )


class PostgresJobOps:
    """The job operations, mixed into `PostgresStore` (which provides the attributes below)."""

    tables: TableNames
    owner: str
    _claimed: set[str]
    _job_sql_cache: _JobSql

    if TYPE_CHECKING:

        def _connection(self) -> contextlib.AbstractAsyncContextManager[Any]: ...

    @property
    def _jobs_sql(self) -> _JobSql:
        sql: _JobSql | None = getattr(self, "_job_sql_cache", None)
        if sql is None:
            sql = _JobSql.build(self.tables)
            self._job_sql_cache = sql
        return sql

    @contextlib.asynccontextmanager
    async def _ops(self) -> AsyncIterator[Any]:
        """A pooled connection; a table without ``not_before`` asks for ``db init``."""
        import asyncpg  # type: ignore[import-untyped]  # the pool is open, so it is loaded already

        try:
            async with self._connection() as conn:
                yield conn
        except asyncpg.exceptions.UndefinedColumnError as exc:
            raise StoreUnavailable(
                f"the {self.tables.job} table predates job operations ({exc}): "
                "run `python -m agentlife db init`"
            ) from None

    async def claim_next(self, agent_id: str | None = None) -> JobRecord | None:
        """Claim the oldest runnable job (of ``agent_id``, or of any agent); None when there is none.

        A row that cannot be read is set aside (DEAD_LETTER, the reason in its crash history) and the next
        one is tried, up to `SET_ASIDE_PER_CLAIM` of them per call.
        """
        sql = self._jobs_sql
        async with self._ops() as conn:
            for _ in range(SET_ASIDE_PER_CLAIM):
                if agent_id is None:
                    row = await conn.fetchrow(sql.claim_any, self.owner)
                else:
                    row = await conn.fetchrow(sql.claim_agent, self.owner, agent_id)
                if row is None:
                    return None
                claimed = record(row)
                if not claimed.unreadable:
                    self._claimed.add(claimed.id)
                    return claimed
                # A second statement, fenced by this claim: should the process die before it, the row is
                # RUNNING under a dead owner and the reaper gives it back, to be set aside by the next claim.
                entry = set_aside_entry(claimed, time.time())
                await conn.execute(sql.set_aside, claimed.id, claimed.attempt, self.owner, dumps(entry))
                log_set_aside(claimed)
        return None

    async def list_jobs(
        self, status: str | None = None, agent_id: str | None = None, limit: int = 100
    ) -> list[JobRecord]:
        """Job rows, most recently updated first, filtered by status and agent."""
        async with self._ops() as conn:
            rows = await conn.fetch(self._jobs_sql.list, status, agent_id, limit)
        return [record(row) for row in rows]

    async def count_runnable(self) -> dict[str, int]:
        """How many jobs are runnable now, per agent id."""
        async with self._ops() as conn:
            rows = await conn.fetch(self._jobs_sql.count_runnable)
        return {row[0]: int(row[1]) for row in rows}

    async def _settle(
        self, conn: Any, row: Any, job_id: str, operation: str, allowed: Sequence[str]
    ) -> JobRecord:
        if row is not None:
            return record(row)
        current = await conn.fetchrow(self._jobs_sql.get, job_id)
        raise conflict(job_id, operation, None if current is None else record(current), allowed)

    async def approve(self, job_id: str) -> JobRecord:
        """WAITING_FOR_APPROVAL -> RUNNING (a live process is parked on it) or PENDING."""
        stale_after = Constants().heartbeat.zombie_after_seconds
        allowed = [str(s) for s in APPROVABLE]
        async with self._ops() as conn:
            row = await conn.fetchrow(self._jobs_sql.approve, job_id, stale_after, allowed)
            return await self._settle(conn, row, job_id, "approve", APPROVABLE)

    async def _operate(
        self,
        job_id: str,
        operation: str,
        allowed: Sequence[str],
        status: str,
        entry: dict[str, Any],
        *,
        bump: bool = False,
        release: bool = False,
    ) -> JobRecord:
        async with self._ops() as conn:
            row = await conn.fetchrow(
                self._jobs_sql.operate,
                job_id,
                dumps(entry),
                [str(s) for s in allowed],
                status,
                1 if bump else 0,
                release,
            )
            return await self._settle(conn, row, job_id, operation, allowed)

    async def reject(self, job_id: str, reason: str) -> JobRecord:
        """WAITING_FOR_APPROVAL -> FAILED, the reason recorded."""
        entry = operator_record("ApprovalRejected", reason, 0, time.time())
        del entry["attempt"]  # the statement adds the row's own
        return await self._operate(job_id, "reject", APPROVABLE, JobStatus.FAILED, entry)

    async def cancel(self, job_id: str, reason: str) -> JobRecord:
        """PENDING, RETRYING, RUNNING or WAITING_FOR_APPROVAL -> FAILED, ``attempt + 1``."""
        entry = operator_record("Cancelled", reason, 0, time.time())
        del entry["attempt"]
        # The bumped attempt fences out a process still running the job (and drops its claim token).
        return await self._operate(job_id, "cancel", CANCELLABLE, JobStatus.FAILED, entry, bump=True)

    async def retry(self, job_id: str) -> JobRecord:
        """FAILED or DEAD_LETTER -> PENDING, runnable now."""
        entry = retry_marker(0, time.time())
        del entry["attempt"]
        return await self._operate(job_id, "retry", RETRYABLE, JobStatus.PENDING, entry, release=True)

    async def reap(
        self,
        threshold_seconds: float,
        now: float | None = None,
        constants: Constants | None = None,
        *,
        dead_owners: bool = False,
    ) -> list[ReapDecision]:
        """Move RUNNING rows whose heartbeat is older than ``threshold_seconds`` on; see the protocol."""
        constants = constants or Constants()
        sql = self._jobs_sql
        window = constants.budget.circuit_window_seconds
        decisions: list[ReapDecision] = []
        async with self._ops() as conn:
            # Heartbeats carry the server's clock: judge them by it, not by this host's.
            at = float(await conn.fetchval(sql.server_now)) if now is None else now
            cutoff = at - threshold_seconds
            candidates: list[tuple[str, str | None]] = [
                (r[0], None) for r in await conn.fetch(sql.stale, cutoff)
            ]
            if dead_owners:
                stale = {job_id for job_id, _ in candidates}
                owned = await conn.fetch(sql.owned_here, f"{socket.gethostname()}:%")
                candidates += [(i, o) for i, o in owned if i not in stale and owner_is_gone(o)]
            for job_id, gone in candidates:
                async with conn.transaction():
                    if gone is None:
                        locked = await conn.fetchrow(sql.lock_stale, job_id, cutoff)
                    else:
                        locked = await conn.fetchrow(sql.lock_owned, job_id, gone)
                    if locked is None:
                        continue  # another reaper holds it or got there first, or a heartbeat came in
                    row = record(locked)
                    seen = row.heartbeat_at if row.heartbeat_at is not None else row.updated_at
                    histories = await conn.fetch(sql.agent_errors, row.agent_id, at - window)
                    crashes = crash_count(decode_histories(h[0] for h in histories), at - window)
                    decision, entry = decide_reap(
                        row,
                        now=at,
                        heartbeat_age=at - (seen or 0.0),
                        threshold=threshold_seconds,
                        agent_crashes=crashes,
                        constants=constants,
                        owner_gone=gone is not None,
                    )
                    done = await conn.fetchval(
                        sql.reap, job_id, row.attempt, decision.status, decision.not_before, at, dumps(entry)
                    )
                    if done:
                        decisions.append(decision)
        return decisions

    async def release(self, job_id: str, attempt: int, status: str, *, delay_seconds: float = 0.0) -> bool:
        """Hand back a RUNNING job held by ``attempt``; see the protocol."""
        state = check_releasable(status)
        async with self._ops() as conn:
            done = await conn.fetchval(self._jobs_sql.release, job_id, attempt, state, float(delay_seconds))
        return bool(done)


def record(row: Any) -> JobRecord:
    """A `JobRecord` from an asyncpg row (``not_before`` when the query selected it).

    A JSON column the row holds but agentlife cannot read (jsonb keeps ``1e400``, no float does) is named in
    ``JobRecord.unreadable`` rather than raised: see `agentlife.stores._rows`.
    """
    columns = {name: row[name] for name in ("id", "agent_id", "status", "attempt", *JSON_COLUMNS)}
    columns.update(
        checkpoint_id=row["checkpoint_id"],
        checkpoint_crc=row["checkpoint_crc"],
        heartbeat_at=unix(row["heartbeat_at"]),
        updated_at=unix(row["updated_at"]),
        not_before=unix(row.get("not_before")),
    )
    return job_record(columns)


def unix(value: datetime | None) -> float | None:
    """A timestamptz as unix time."""
    return None if value is None else value.timestamp()


def dumps(value: Any) -> str | None:
    """JSON text for a jsonb parameter (None stays NULL)."""
    return None if value is None else orjson.dumps(value).decode()


def loads(value: str | bytes | None) -> Any:
    """A jsonb column's value."""
    return None if value is None else orjson.loads(value)
