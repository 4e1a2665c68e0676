"""Job operations of `PostgresStore`: claim, list, approve / reject / cancel / retry, and the reaper.

The claim is one statement: the oldest runnable row, found through a partial index on ``not_before`` and
locked ``FOR UPDATE SKIP LOCKED`` so concurrent claimers each get a different row, updated in the same
statement. Cancel is one conditional UPDATE (``WHERE status = ANY(...)``); approve, reject and retry, which
also rewrite the approval record, lock the row (``FOR UPDATE``), check its status and update it in one
transaction: of two racing on a row, the second waits for the first and reports the status it left. The
reaper locks each stale row with ``SKIP LOCKED`` and updates it only if it is still RUNNING with the same
attempt.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import orjson

from agentlife._exceptions import AttemptFenced, StoreUnavailable
from agentlife.constants import Constants
from agentlife.stores._approval import (
    ApprovalRequest,
    ApprovalState,
    check_request,
    granted,
    rejected,
    rejection_record,
    requested,
    retried,
)
from agentlife.stores._base import (
    CLAIM_STALE_AFTER_SECONDS,
    REAPED_OWNER,
    JobRecord,
    JobStatus,
    TableNames,
    owner_is_gone,
    owner_is_live,
)
from agentlife.stores._jobs import (
    APPROVABLE,
    CANCELLABLE,
    RETRYABLE,
    RUNNABLE,
    SET_ASIDE_PER_CLAIM,
    TERMINAL,
    ReapDecision,
    check_releasable,
    check_transition,
    conflict,
    crash_count,
    decide_reap,
    operator_record,
    retry_marker,
)
from agentlife.stores._pg_listen import PgListener, notify_call
from agentlife.stores._pg_statements import HEARTBEAT_AGE
from agentlife.stores._rows import (
    JSON_COLUMNS,
    SET_ASIDE_STATUS,
    decode_histories,
    job_record,
    log_set_aside,
    set_aside_entry,
)

__all__ = ["JOB_COLUMNS", "PostgresJobOps", "dumps", "loads", "pg_job_schema", "record", "unix"]

log = logging.getLogger("agentlife.store")

JOB_COLUMNS = (
    "id, agent_id, status, payload, attempt, checkpoint_id, checkpoint_crc, heartbeat_at, tokens_consumed,"
    " token_budget, error, result, updated_at"
)
_COLUMNS = f"{JOB_COLUMNS}, not_before"
_RUNNABLE = f"status IN ({', '.join(repr(str(s)) for s in RUNNABLE)})"
_DUE = "(not_before IS NULL OR not_before <= now())"
#: Wake this long after a timer's time, so that the claim that follows finds the row due.
_DUE_MARGIN_SECONDS = 0.02
#: Seconds from now to the earliest ``not_before`` of the rows selected. Each side is taken as epoch seconds
#: first: PostgreSQL keeps ``'infinity'`` as a timestamp (a row parked for ever by another client) and
#: refuses to subtract it, while its epoch is the float infinity, a timer that never comes due.
_SECONDS_TO_NEXT_DUE = "(EXTRACT(EPOCH FROM min(not_before)) - EXTRACT(EPOCH FROM now()))::float8"
#: How long the next due time a fruitless claim returned stands in for asking again.
_DUE_HINT_SECONDS = 0.5
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def pg_job_schema(t: TableNames) -> tuple[str, ...]:
    """The ``not_before`` and ``approval`` columns (added to an older table too), the runnable-job indexes."""
    schema, _, base = t.job.rpartition(".")
    prefix = f"{schema}." if schema else ""
    return (
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS not_before timestamptz DEFAULT now()",
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS approval jsonb",
        # The indexes before WAITING was runnable: their predicate no longer matches the claim's.
        f"DROP INDEX IF EXISTS {prefix}{base}_runnable_idx",
        f"DROP INDEX IF EXISTS {prefix}{base}_agent_runnable_idx",
        f"CREATE INDEX IF NOT EXISTS {base}_due_idx ON {t.job} (not_before NULLS FIRST, id)"
        f" WHERE {_RUNNABLE}",
        f"CREATE INDEX IF NOT EXISTS {base}_agent_due_idx ON {t.job}"
        f" (agent_id, not_before NULLS FIRST, id) WHERE {_RUNNABLE}",
        # `list_jobs` pages by (updated_at, id) from a cursor: each of its orders is one index range.
        f"CREATE INDEX IF NOT EXISTS {base}_listed_idx ON {t.job} (updated_at DESC, id)",
        f"CREATE INDEX IF NOT EXISTS {base}_status_listed_idx ON {t.job} (status, updated_at DESC, id)",
        f"CREATE INDEX IF NOT EXISTS {base}_agent_listed_idx ON {t.job} (agent_id, updated_at DESC, id)",
    )


@dataclass(frozen=True, slots=True)
class _JobSql:
    claim_any: str
    claim_agent: str
    get: str
    count_runnable: str
    next_due: str
    lock_row: str
    approve: str
    reject: str
    retry: str
    cancel: str
    lock_fenced: str
    park: str
    approval: str
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
        notify = notify_call(t)  # see _pg_listen: sent on commit, and only by a write that matched a row

        def claim(agent: str) -> str:
            return (
                f"WITH next AS (SELECT id AS next_id FROM {j} WHERE {agent}{_RUNNABLE} AND {_DUE}"
                " ORDER BY not_before NULLS FIRST, id LIMIT 1 FOR UPDATE SKIP LOCKED)"
                f" UPDATE {j} SET status = 'RUNNING', attempt = attempt + 1, owner = $1,"
                " heartbeat_at = now(), updated_at = now()"
                f" FROM next WHERE id = next.next_id RETURNING {_COLUMNS}"
            )

        # One row always: the claimed job's columns, or NULLs and the seconds until the agent's next row
        # not yet due (a timer's end) comes due, which the idle wait after a fruitless claim needs. One
        # round trip where there were two: an idle worker's only statements are its fallback polls. The
        # due time is looked up only when nothing was claimed (an uncorrelated NOT EXISTS: a one-time filter).
        next_due_when_idle = (
            f"SELECT {_SECONDS_TO_NEXT_DUE} FROM {j}"
            f" WHERE agent_id = $2 AND {_RUNNABLE} AND not_before > now()"
            " AND NOT EXISTS (SELECT 1 FROM claimed)"
        )
        claim_agent = (
            f"WITH claimed AS ({claim('agent_id = $2 AND ')})"
            f" SELECT claimed.*, ({next_due_when_idle}) AS next_due FROM (SELECT 1) AS one"
            " LEFT JOIN claimed ON true"
        )

        # The appended entry gets the row's attempt as it was before this statement.
        append = (
            "error = COALESCE(error, '[]'::jsonb) || jsonb_build_array($2::jsonb"
            " || jsonb_build_object('attempt', attempt))"
        )
        history = "error = COALESCE(error, '[]'::jsonb) || jsonb_build_array($2::jsonb)"
        return cls(
            claim_any=claim(""),
            claim_agent=claim_agent,
            get=f"SELECT {_COLUMNS} FROM {j} WHERE id = $1",
            # The index of runnable rows ends the scan at the first row not yet due: a row parked at a
            # timer (WAITING) or backing off (RETRYING) of this agent, its time as seconds from now.
            next_due=(
                f"SELECT {_SECONDS_TO_NEXT_DUE} FROM {j}"
                f" WHERE agent_id = $1 AND {_RUNNABLE} AND not_before > now()"
            ),
            count_runnable=(
                f"SELECT agent_id, count(*) FROM {j} WHERE {_RUNNABLE} AND {_DUE} GROUP BY agent_id"
            ),
            lock_row=(
                f"SELECT {_COLUMNS}, owner, approval,"
                f" {HEARTBEAT_AGE} AS heartbeat_age FROM {j}"
                " WHERE id = $1 FOR UPDATE"
            ),
            approve=(
                f"UPDATE {j} SET status = $2, approval = $3::jsonb, not_before = now(), updated_at = now()"
                f" WHERE id = $1 RETURNING {_COLUMNS}, CASE WHEN $2 = 'PENDING' THEN {notify} END AS notified"
            ),
            reject=(
                f"UPDATE {j} SET status = 'FAILED', {history}, approval = $3::jsonb, updated_at = now()"
                f" WHERE id = $1 RETURNING {_COLUMNS}"
            ),
            # The owner stays: a reaped row's tombstone must go on fencing out the process it was taken from.
            retry=(
                f"UPDATE {j} SET status = 'PENDING', {history}, approval = $3::jsonb, not_before = now(),"
                f" updated_at = now() WHERE id = $1 RETURNING {_COLUMNS}, {notify} AS notified"
            ),
            cancel=(
                f"UPDATE {j} SET status = 'FAILED', {append}, updated_at = now(),"
                " attempt = attempt + 1, owner = NULL"
                f" WHERE id = $1 AND status = ANY($3::text[]) RETURNING {_COLUMNS}"
            ),
            lock_fenced=(
                f"SELECT status, approval FROM {j}"
                " WHERE id = $1 AND attempt = $2 AND (owner IS NULL OR owner = $3) FOR UPDATE"
            ),
            park=f"UPDATE {j} SET status = $2, approval = $3::jsonb, updated_at = now() WHERE id = $1",
            approval=f"SELECT status, approval FROM {j} WHERE id = $1",
            server_now="SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8",
            stale=(
                f"SELECT id FROM {j} WHERE status = 'RUNNING'"
                " AND COALESCE(heartbeat_at, updated_at) < to_timestamp($1) ORDER BY id"
            ),
            lock_stale=(
                f"SELECT {_COLUMNS} FROM {j} WHERE id = $1 AND status = 'RUNNING'"
                " AND COALESCE(heartbeat_at, updated_at) < to_timestamp($2) FOR UPDATE SKIP LOCKED"
            ),
            owned_here=(
                f"SELECT id, owner FROM {j} WHERE status = 'RUNNING' AND owner LIKE $1"
                " AND COALESCE(heartbeat_at, updated_at) < to_timestamp($2) ORDER BY id"
            ),
            lock_owned=(
                f"SELECT {_COLUMNS} FROM {j} WHERE id = $1 AND status = 'RUNNING' AND owner = $2"
                " AND COALESCE(heartbeat_at, updated_at) < to_timestamp($3) FOR UPDATE SKIP LOCKED"
            ),
            agent_errors=f"SELECT error FROM {j} WHERE agent_id = $1 AND updated_at >= to_timestamp($2)",
            reap=(
                f"UPDATE {j} SET status = $3, owner = $7,"
                " not_before = to_timestamp($4), updated_at = to_timestamp($5),"
                " error = COALESCE(error, '[]'::jsonb) || jsonb_build_array($6::jsonb)"
                " WHERE id = $1 AND status = 'RUNNING' AND attempt = $2 RETURNING 1,"
                # A row whose backoff has not ended is not runnable yet: the fallback poll finds it later.
                f" CASE WHEN $3 IN ('PENDING', 'RETRYING') AND {_DUE} THEN {notify} END"
            ),
            release=(
                f"UPDATE {j} SET status = $3, owner = NULL, not_before = now() + make_interval(secs => $4),"
                " updated_at = now() WHERE id = $1 AND attempt = $2 AND status = 'RUNNING' RETURNING 1,"
                f" CASE WHEN $4::float8 <= 0 THEN {notify} END"
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
    _listener: PgListener | None
    _pool: Any
    #: What the last fruitless claim learnt: (agent id, monotonic time, seconds until its next row is due).
    _due_hint: tuple[str, float, float | None] | None = None

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
        self._due_hint = None
        async with self._ops() as conn:
            for _ in range(SET_ASIDE_PER_CLAIM):
                if agent_id is None:
                    row = await conn.fetchrow(sql.claim_any, self.owner)
                else:
                    row = await conn.fetchrow(sql.claim_agent, self.owner, agent_id)
                    if row["id"] is None:
                        self._due_hint = (agent_id, time.monotonic(), row["next_due"])
                        return None
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
        self,
        status: str | None = None,
        agent_id: str | None = None,
        limit: int = 100,
        *,
        after: tuple[Any, str | bytes | None] | None = None,
    ) -> list[JobRecord]:
        """Job rows, most recently updated first, filtered by status and agent, after the cursor ``after``."""
        # One statement per shape, not ``$1 IS NULL OR ...``: a generic plan of that form cannot use the
        # index range a page needs.
        clauses: list[str] = []
        args: list[Any] = []
        for column, value in (("status", status), ("agent_id", agent_id)):
            if value is not None:
                args.append(value)
                clauses.append(f"{column} = ${len(args)}")
        if after is not None:
            args += [cursor_timestamp(after[0]), _text_key(after[1])]
            at, key = f"${len(args) - 1}", f"${len(args)}"
            clauses.append(f"updated_at <= {at} AND (updated_at < {at} OR id > {key})")
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        args.append(limit)
        order = f"ORDER BY updated_at DESC, id LIMIT ${len(args)}"
        sql = f"SELECT {_COLUMNS} FROM {self.tables.job}{where} {order}"
        async with self._ops() as conn:
            rows = await conn.fetch(sql, *args)
        return [record(row) for row in rows]

    @property
    def notifies(self) -> bool:
        """Whether `wait_for_work` returns as soon as a job is made runnable (``LISTEN``).

        True unless built with ``listen=False``: a worker may then poll slowly while idle.
        """
        return self._listener is not None

    async def wait_for_work(self, agent_id: str, timeout: float) -> bool:
        """Wait on this store's ``LISTEN`` connection for a job of ``agent_id`` to become runnable.

        True when notified (also right after the connection was opened, or re-opened, since notifications
        sent before then are lost: claim once), False at ``timeout``. Never raises (but for cancellation): a
        dropped or refused connection is logged once and the wait sleeps; a later call connects again.
        With ``listen=False`` it only sleeps.
        """
        if self._listener is None or self._pool is None:  # closed: no connection to leave behind
            await anyio.sleep(timeout)
            return False
        due = await self._next_due_in(agent_id)
        if due is not None and due < timeout:
            # No statement notifies when a timer comes due: wake for it (a sleep's end, a backoff's).
            await self._listener.wait(agent_id, due + _DUE_MARGIN_SECONDS)
            return True
        return await self._listener.wait(agent_id, timeout)

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
            async with self._ops() as conn:
                due = await conn.fetchval(self._jobs_sql.next_due, agent_id)
        except Exception as exc:  # the fallback poll still finds it: never fail the idle wait
            log.debug("next due time of %s unknown: %s", agent_id, type(exc).__name__)
            return None
        return None if due is None else max(float(due), 0.0)

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

    async def _locked_transition(
        self, conn: Any, job_id: str, operation: str, allowed: Sequence[str]
    ) -> tuple[JobRecord, Any]:
        """Lock the row, check that its status allows ``operation``; (the row, the locked record)."""
        locked = await conn.fetchrow(self._jobs_sql.lock_row, job_id)
        row = check_transition(job_id, operation, None if locked is None else record(locked), allowed)
        return row, locked

    async def approve(
        self, job_id: str, *, invocation_id: str | None = None, digest: str | None = None
    ) -> JobRecord:
        """Grant the call the job is parked on: RUNNING for a live parked process, else PENDING."""
        async with self._ops() as conn, conn.transaction():
            _, locked = await self._locked_transition(conn, job_id, "approve", APPROVABLE)
            approval = loads(locked["approval"])
            check_request(job_id, approval, invocation_id, digest)
            live = owner_is_live(locked["owner"], locked["heartbeat_age"], CLAIM_STALE_AFTER_SECONDS)
            column, _ = granted(approval, time.time())
            status = JobStatus.RUNNING if live else JobStatus.PENDING
            return record(await conn.fetchrow(self._jobs_sql.approve, job_id, str(status), dumps(column)))

    async def reject(self, job_id: str, reason: str) -> JobRecord:
        """WAITING_FOR_APPROVAL -> FAILED, final, the reason recorded."""
        async with self._ops() as conn, conn.transaction():
            row, locked = await self._locked_transition(conn, job_id, "reject", APPROVABLE)
            now = time.time()
            column, request = rejected(loads(locked["approval"]), reason, now)
            entry = rejection_record(operator_record("ApprovalRejected", reason, row.attempt, now), request)
            return record(await conn.fetchrow(self._jobs_sql.reject, job_id, dumps(entry), dumps(column)))

    async def cancel(self, job_id: str, reason: str) -> JobRecord:
        """PENDING, RETRYING, RUNNING or WAITING_FOR_APPROVAL -> FAILED, ``attempt + 1``."""
        entry = operator_record("Cancelled", reason, 0, time.time())
        del entry["attempt"]  # the statement adds the row's own
        allowed = [str(s) for s in CANCELLABLE]
        # The bumped attempt fences out a process still running the job (and drops its claim token).
        async with self._ops() as conn:
            row = await conn.fetchrow(self._jobs_sql.cancel, job_id, dumps(entry), allowed)
            return await self._settle(conn, row, job_id, "cancel", CANCELLABLE)

    async def retry(self, job_id: str) -> JobRecord:
        """FAILED or DEAD_LETTER -> PENDING, runnable now; approves nothing."""
        async with self._ops() as conn, conn.transaction():
            row, locked = await self._locked_transition(conn, job_id, "retry", RETRYABLE)
            entry = retry_marker(row.attempt, time.time())
            column = retried(loads(locked["approval"]))
            return record(await conn.fetchrow(self._jobs_sql.retry, job_id, dumps(entry), dumps(column)))

    async def request_approval(self, job_id: str, attempt: int, request: ApprovalRequest) -> ApprovalState:
        """Park on ``request`` unless a grant names it or the job has ended; see the protocol."""
        sql = self._jobs_sql
        async with self._ops() as conn, conn.transaction():
            found = await conn.fetchrow(sql.lock_fenced, job_id, attempt, self.owner)
            if found is None:
                raise AttemptFenced(f"job {job_id}: approval request by attempt {attempt} refused")
            approval = loads(found["approval"])
            state = ApprovalState.from_column(found["status"], approval)
            if state.status in TERMINAL or state.granted(request):
                return state
            column = requested(approval, request, time.time())
            waiting = str(JobStatus.WAITING_FOR_APPROVAL)
            await conn.execute(sql.park, job_id, waiting, dumps(column))
        return ApprovalState.from_column(waiting, column)

    async def get_approval(self, job_id: str) -> ApprovalState | None:
        """The row's status and approval record, or None."""
        async with self._ops() as conn:
            found = await conn.fetchrow(self._jobs_sql.approval, job_id)
        return None if found is None else ApprovalState.from_column(found["status"], loads(found["approval"]))

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
        # A fresh heartbeat always wins over the dead-owner check: the owner must have missed a beat too.
        fresh = constants.heartbeat.job_interval_seconds
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
                owned = await conn.fetch(sql.owned_here, f"{socket.gethostname()}:%", at - fresh)
                candidates += [(i, o) for i, o in owned if i not in stale and owner_is_gone(o)]
            for job_id, gone in candidates:
                async with conn.transaction():
                    if gone is None:
                        locked = await conn.fetchrow(sql.lock_stale, job_id, cutoff)
                    else:
                        locked = await conn.fetchrow(sql.lock_owned, job_id, gone, at - fresh)
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
                        sql.reap,
                        job_id,
                        row.attempt,
                        decision.status,
                        decision.not_before,
                        at,
                        dumps(entry),
                        REAPED_OWNER,
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
    """A timestamptz as unix time; ``'infinity'`` and ``'-infinity'`` as those of the latest and earliest.

    asyncpg reads PostgreSQL's infinities as the naive ``datetime.max`` and ``datetime.min``: taken as UTC
    (as local time, the earliest is out of range and the row could not be read at all).
    """
    if value is None:
        return None
    return (value.replace(tzinfo=UTC) if value.tzinfo is None else value).timestamp()


#: The unix times `unix` gives PostgreSQL's ``'infinity'`` and ``'-infinity'``.
_LATEST, _EARLIEST = unix(datetime.max), unix(datetime.min)


def cursor_timestamp(seconds: Any) -> datetime:
    """The timestamptz of a `list_jobs` cursor's unix time (a row's ``updated_at``), exactly.

    The exact microseconds: a float's own rounding must not skip or repeat a row. At or beyond what a
    datetime holds it is PostgreSQL's infinity (asyncpg writes the naive ``datetime.max`` as ``'infinity'``),
    the time `unix` reads such a row at, so the rows parked there are paged like any others.

    Raises:
        ValueError: ``seconds`` is not a number (not a cursor of this store).
    """
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds != seconds:
        raise ValueError("a PostgreSQL cursor's time is a number of seconds")
    assert _LATEST is not None and _EARLIEST is not None
    if seconds >= _LATEST:
        return datetime.max
    if seconds <= _EARLIEST:
        return datetime.min
    return _EPOCH + timedelta(microseconds=round(seconds * 1_000_000))


def _text_key(key: Any) -> str:
    """A cursor's id as a text parameter; `ValueError` for one no PostgreSQL text column holds."""
    if not isinstance(key, str) or "\x00" in key:
        raise ValueError("a PostgreSQL cursor's id is text without NUL")
    try:
        key.encode()
    except UnicodeEncodeError:
        raise ValueError("a PostgreSQL cursor's id is UTF-8 text") from None
    return key


def dumps(value: Any) -> str | None:
    """JSON text for a jsonb parameter (None stays NULL)."""
    return None if value is None else orjson.dumps(value).decode()


def loads(value: str | bytes | None) -> Any:
    """A jsonb column's value."""
    return None if value is None else orjson.loads(value)
