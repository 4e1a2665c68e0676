"""Job operations of `SQLiteStore`: claim, list, approve / reject / cancel / retry, and the reaper.

Each runs in one ``BEGIN IMMEDIATE`` transaction: SQLite's write lock makes the read-check-write atomic
across processes, so two claimers or two reapers never act on one row.
"""

from __future__ import annotations

import socket
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import orjson

from agentlife._exceptions import AttemptFenced
from agentlife.constants import Constants
from agentlife.stores._approval import (
    ApprovalRequest,
    ApprovalState,
    check_request,
    granted,
    loads_approval,
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
    crash_count,
    decide_reap,
    operator_record,
    retry_marker,
)
from agentlife.stores._rows import SET_ASIDE_STATUS, decode_histories, log_set_aside, set_aside_entry

__all__ = ["FENCE", "SQLiteJobOps", "sqlite_job_schema"]

_T = TypeVar("_T")
_RUNNABLE = f"status IN ({', '.join(repr(str(s)) for s in RUNNABLE)})"
#: Every write after the claim is fenced by attempt *and* claim token; a row without a token (created by a
#: control plane, or claimed before tokens existed) is fenced by attempt alone.
FENCE = "attempt = ? AND (owner IS NULL OR owner = ?)"
#: A SET clause and its values, in order.
_Set = tuple[str, dict[str, Any]]
#: A transition's change: (the row, its owner, its decoded approval column, now) -> the SET clause.
_Change = Callable[[JobRecord, "str | None", Any, float], _Set]


def sqlite_job_schema(t: TableNames) -> list[str]:
    """The indexes of the runnable-job lookup (run after the ``not_before`` column exists)."""
    schema, _, base = t.job.rpartition(".")
    prefix = f"{schema}." if schema else ""
    return [
        # The indexes before WAITING was runnable: their predicate no longer matches the claim's.
        f"DROP INDEX IF EXISTS {prefix}{base}_runnable",
        f"DROP INDEX IF EXISTS {prefix}{base}_agent_runnable",
        f"CREATE INDEX IF NOT EXISTS {prefix}{base}_due ON {base} (not_before, id) WHERE {_RUNNABLE}",
        f"CREATE INDEX IF NOT EXISTS {prefix}{base}_agent_due ON {base} (agent_id, not_before, id)"
        f" WHERE {_RUNNABLE}",
        # `list_jobs` pages by (updated_at, id) from a cursor: each of its orders is one index range.
        f"CREATE INDEX IF NOT EXISTS {prefix}{base}_listed ON {base} (updated_at DESC, id)",
        f"CREATE INDEX IF NOT EXISTS {prefix}{base}_status_listed ON {base} (status, updated_at DESC, id)",
        f"CREATE INDEX IF NOT EXISTS {prefix}{base}_agent_listed ON {base} (agent_id, updated_at DESC, id)",
    ]


def _begin(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")


def _finish(conn: sqlite3.Connection, ok: bool) -> None:
    if ok:
        conn.execute("COMMIT")
    elif conn.in_transaction:
        conn.execute("ROLLBACK")


def _key_param(key: str | bytes | None) -> tuple[str, tuple[Any, ...]]:
    """The test "id follows ``key``" in SQLite's order of ids, and its parameters."""
    if key is None:  # a NULL id (SQLite's PRIMARY KEY allows one) comes before every other
        return "id IS NOT NULL", ()
    if isinstance(key, bytes):  # a BLOB: after every text id, then by its bytes
        return "id > ?", (key,)
    try:
        key.encode()
    except UnicodeEncodeError:  # text that is not UTF-8 (`JobRecord.key`): the same bytes, as text
        return "id > CAST(? AS TEXT)", (key.encode("utf-8", "surrogateescape"),)
    return "id > ?", (key,)


class SQLiteJobOps:
    """The job operations, mixed into `SQLiteStore` (which provides the attributes below)."""

    tables: TableNames
    owner: str
    _claimed: set[str]

    if TYPE_CHECKING:

        async def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T: ...

        def _row(
            self, conn: sqlite3.Connection, job_id: str | None, *, rowid: int | None = None
        ) -> JobRecord | None: ...

    async def _transaction(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        def run(conn: sqlite3.Connection) -> _T:
            _begin(conn)
            ok = False
            try:
                result = fn(conn)
                ok = True
                return result
            finally:
                _finish(conn, ok)

        return await self._run(run)

    async def claim_next(self, agent_id: str | None = None) -> JobRecord | None:
        """Claim the oldest runnable job (of ``agent_id``, or of any agent); None when there is none.

        A row that cannot be read is set aside (DEAD_LETTER, the reason in its crash history) and the next
        one is tried, up to `SET_ASIDE_PER_CLAIM` of them per call.
        """

        def claim(conn: sqlite3.Connection) -> tuple[JobRecord | None, list[JobRecord]]:
            now = time.time()
            where = f"{_RUNNABLE} AND (not_before IS NULL OR not_before <= ?)"
            args: tuple[Any, ...] = (now,)
            if agent_id is not None:
                where, args = f"agent_id = ? AND {where}", (agent_id, now)
            set_aside: list[JobRecord] = []
            while len(set_aside) < SET_ASIDE_PER_CLAIM:
                # By rowid: a row whose id another client wrote as a BLOB, or as text that is not UTF-8,
                # cannot be found by its id, and must be set aside rather than stop every later claim.
                row = conn.execute(
                    f"SELECT rowid FROM {self.tables.job} WHERE {where} ORDER BY not_before, id LIMIT 1", args
                ).fetchone()
                if row is None:
                    return None, set_aside
                conn.execute(
                    f"UPDATE {self.tables.job} SET status = ?, attempt = attempt + 1, owner = ?,"
                    " heartbeat_at = ?, updated_at = ? WHERE rowid = ?",
                    (str(JobStatus.RUNNING), self.owner, now, now, row[0]),
                )
                record = self._row(conn, None, rowid=row[0])
                assert record is not None
                if not record.unreadable:
                    self._claimed.add(record.id)
                    return record, set_aside
                conn.execute(
                    f"UPDATE {self.tables.job} SET status = ?, owner = NULL, error = ?, updated_at = ?"
                    " WHERE rowid = ?",
                    (str(SET_ASIDE_STATUS), _append(record.error, set_aside_entry(record, now)), now, row[0]),
                )
                set_aside.append(record)
            return None, set_aside

        claimed, set_aside = await self._transaction(claim)
        for record in set_aside:
            log_set_aside(record)
        return claimed

    async def list_jobs(
        self,
        status: str | None = None,
        agent_id: str | None = None,
        limit: int = 100,
        *,
        after: tuple[Any, str | bytes | None] | None = None,
    ) -> list[JobRecord]:
        """Job rows, most recently updated first, filtered by status and agent, after the cursor ``after``."""

        def select(conn: sqlite3.Connection) -> list[JobRecord]:
            clauses: list[str] = []
            args: list[Any] = []
            if status is not None:
                clauses.append("status = ?")
                args.append(status)
            if agent_id is not None:
                clauses.append("agent_id = ?")
                args.append(agent_id)
            if after is not None:
                # The first term bounds the index range; the second skips the cursor's own ties. The key is
                # compared as stored (SQLite orders NULL, then text by its bytes, then BLOBs): an id that is
                # a BLOB or text that is not UTF-8 must not come back as the first row of the next page.
                key, param = _key_param(after[1])
                clauses.append(f"updated_at <= ? AND (updated_at < ? OR {key})")
                args += [after[0], after[0], *param]
            where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
            rowids = conn.execute(
                f"SELECT rowid FROM {self.tables.job}{where} ORDER BY updated_at DESC, id LIMIT ?",
                (*args, limit),
            ).fetchall()
            return [r for r in (self._row(conn, None, rowid=i) for (i,) in rowids) if r is not None]

        return await self._run(select)

    #: False: SQLite has no notifications, `wait_for_work` sleeps and an idle worker polls.
    notifies = False

    async def wait_for_work(self, agent_id: str, timeout: float) -> bool:
        """SQLite has no notifications: sleep ``timeout`` seconds and return False (the worker polls)."""
        await anyio.sleep(timeout)
        return False

    async def count_runnable(self) -> dict[str, int]:
        """How many jobs are runnable now, per agent id."""

        def count(conn: sqlite3.Connection) -> dict[str, int]:
            rows = conn.execute(
                f"SELECT CAST(agent_id AS BLOB), count(*) FROM {self.tables.job}"
                f" WHERE {_RUNNABLE} AND (not_before IS NULL OR not_before <= ?) GROUP BY agent_id",
                (time.time(),),
            ).fetchall()
            return {bytes(agent).decode(errors="replace"): n for agent, n in rows if agent is not None}

        return await self._run(count)

    async def _transition(
        self, job_id: str, operation: str, allowed: Sequence[str], change: _Change
    ) -> JobRecord:
        """Check the status and apply ``change`` (-> SET clause, values) inside one write transaction."""

        def apply(conn: sqlite3.Connection) -> JobRecord:
            row = check_transition(job_id, operation, self._row(conn, job_id), allowed)
            owner, approval = conn.execute(
                f"SELECT owner, approval FROM {self.tables.job} WHERE id = ?", (job_id,)
            ).fetchone()
            now = time.time()
            assignments, values = change(row, owner, loads_approval(approval), now)
            conn.execute(
                f"UPDATE {self.tables.job} SET {assignments}, updated_at = ? WHERE id = ?",
                (*values.values(), now, job_id),
            )
            changed = self._row(conn, job_id)
            assert changed is not None
            return changed

        return await self._transaction(apply)

    async def approve(
        self, job_id: str, *, invocation_id: str | None = None, digest: str | None = None
    ) -> JobRecord:
        """Grant the call the job is parked on: RUNNING for a live parked process, else PENDING."""

        def change(row: JobRecord, owner: str | None, approval: Any, now: float) -> _Set:
            check_request(job_id, approval, invocation_id, digest)
            age = None if row.heartbeat_at is None else now - row.heartbeat_at
            live = owner_is_live(owner, age, CLAIM_STALE_AFTER_SECONDS)
            column, _ = granted(approval, now)
            return "status = ?, not_before = ?, approval = ?", {
                "s": str(JobStatus.RUNNING if live else JobStatus.PENDING),
                "n": now,
                "a": _json(column),
            }

        return await self._transition(job_id, "approve", APPROVABLE, change)

    async def reject(self, job_id: str, reason: str) -> JobRecord:
        """WAITING_FOR_APPROVAL -> FAILED, final, the reason recorded."""

        def change(row: JobRecord, owner: str | None, approval: Any, now: float) -> _Set:
            column, request = rejected(approval, reason, now)
            entry = rejection_record(operator_record("ApprovalRejected", reason, row.attempt, now), request)
            return "status = ?, error = ?, approval = ?", {
                "s": str(JobStatus.FAILED),
                "e": _append(row.error, entry),
                "a": _json(column),
            }

        return await self._transition(job_id, "reject", APPROVABLE, change)

    async def cancel(self, job_id: str, reason: str) -> JobRecord:
        """PENDING, RETRYING, RUNNING or WAITING_FOR_APPROVAL -> FAILED, ``attempt + 1``."""

        def change(row: JobRecord, owner: str | None, approval: Any, now: float) -> _Set:
            entry = operator_record("Cancelled", reason, row.attempt, now)
            return "status = ?, error = ?, attempt = attempt + 1, owner = NULL", {
                "s": str(JobStatus.FAILED),
                "e": _append(row.error, entry),
            }

        return await self._transition(job_id, "cancel", CANCELLABLE, change)

    async def retry(self, job_id: str) -> JobRecord:
        """FAILED or DEAD_LETTER -> PENDING, runnable now; approves nothing."""

        # The owner stays: a reaped row's tombstone must go on fencing out the process it was taken from.
        def change(row: JobRecord, owner: str | None, approval: Any, now: float) -> _Set:
            entry = retry_marker(row.attempt, now)
            return "status = ?, error = ?, not_before = ?, approval = ?", {
                "s": str(JobStatus.PENDING),
                "e": _append(row.error, entry),
                "n": now,
                "a": _json(retried(approval)),
            }

        return await self._transition(job_id, "retry", RETRYABLE, change)

    async def request_approval(self, job_id: str, attempt: int, request: ApprovalRequest) -> ApprovalState:
        """Park on ``request`` unless a grant names it or the job has ended; see the protocol."""

        def apply(conn: sqlite3.Connection) -> ApprovalState:
            found = conn.execute(
                f"SELECT status, approval FROM {self.tables.job} WHERE id = ? AND {FENCE}",
                (job_id, attempt, self.owner),
            ).fetchone()
            if found is None:
                raise AttemptFenced(f"job {job_id}: approval request by attempt {attempt} refused")
            approval = loads_approval(found[1])
            state = ApprovalState.from_column(found[0], approval)
            if state.status in TERMINAL or state.granted(request):
                return state
            column = requested(approval, request, time.time())
            conn.execute(
                f"UPDATE {self.tables.job} SET status = ?, approval = ?, updated_at = ? WHERE id = ?",
                (str(JobStatus.WAITING_FOR_APPROVAL), _json(column), time.time(), job_id),
            )
            return ApprovalState.from_column(JobStatus.WAITING_FOR_APPROVAL, column)

        return await self._transaction(apply)

    async def get_approval(self, job_id: str) -> ApprovalState | None:
        """The row's status and approval record, or None."""

        def read(conn: sqlite3.Connection) -> ApprovalState | None:
            found = conn.execute(
                f"SELECT status, approval FROM {self.tables.job} WHERE id = ?", (job_id,)
            ).fetchone()
            return None if found is None else ApprovalState.from_column(found[0], loads_approval(found[1]))

        return await self._run(read)

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
        j = self.tables.job
        # A fresh heartbeat always wins over the dead-owner check: the owner must have missed a beat too.
        fresh = constants.heartbeat.job_interval_seconds

        def candidates(conn: sqlite3.Connection) -> list[tuple[str, str | None]]:
            at = time.time() if now is None else now
            # Ids as bytes, and only those that are UTF-8 text: a row another client wrote with a BLOB id
            # or undecodable text is set aside by the next claim, and must not stop the reaper meanwhile.
            rows = conn.execute(
                f"SELECT CAST(id AS BLOB), NULL FROM {j} WHERE status = ? AND typeof(id) = 'text'"
                " AND COALESCE(heartbeat_at, updated_at) < ? ORDER BY id",
                (str(JobStatus.RUNNING), at - threshold_seconds),
            ).fetchall()
            found = _text_ids(rows)
            if dead_owners:
                stale = {job_id for job_id, _ in found}
                owned = conn.execute(
                    f"SELECT CAST(id AS BLOB), CAST(owner AS BLOB) FROM {j} WHERE status = ?"
                    " AND typeof(id) = 'text' AND owner LIKE ? AND COALESCE(heartbeat_at, updated_at) < ?"
                    " ORDER BY id",
                    (str(JobStatus.RUNNING), f"{socket.gethostname()}:%", at - fresh),
                ).fetchall()
                found += [(i, o) for i, o in _text_ids(owned) if i not in stale and o and owner_is_gone(o)]
            return found

        def reap_one(job_id: str, gone: str | None) -> Callable[[sqlite3.Connection], ReapDecision | None]:
            def act(conn: sqlite3.Connection) -> ReapDecision | None:
                at = time.time() if now is None else now
                row = self._row(conn, job_id)
                if row is None or row.status != JobStatus.RUNNING:
                    return None  # another reaper or an operator got there first
                seen = row.heartbeat_at if row.heartbeat_at is not None else row.updated_at
                if gone is not None:
                    (owner,) = conn.execute(f"SELECT owner FROM {j} WHERE id = ?", (job_id,)).fetchone()
                    if owner != gone or (seen or 0.0) >= at - fresh:
                        return None  # claimed again, or a heartbeat came in, meanwhile
                elif (seen or 0.0) >= at - threshold_seconds:
                    return None  # a heartbeat came in meanwhile
                window = constants.budget.circuit_window_seconds
                histories = conn.execute(
                    f"SELECT CAST(error AS BLOB) FROM {j} WHERE agent_id = ? AND updated_at >= ?",
                    (row.agent_id, at - window),
                ).fetchall()
                crashes = crash_count(decode_histories(h for (h,) in histories), at - window)
                decision, entry = decide_reap(
                    row,
                    now=at,
                    heartbeat_age=at - (seen or 0.0),
                    threshold=threshold_seconds,
                    agent_crashes=crashes,
                    constants=constants,
                    owner_gone=gone is not None,
                )
                conn.execute(
                    f"UPDATE {j} SET status = ?, not_before = ?, owner = ?, error = ?,"
                    " updated_at = ? WHERE id = ? AND status = ? AND attempt = ?",
                    (
                        decision.status,
                        decision.not_before,
                        REAPED_OWNER,
                        _append(row.error, entry),
                        at,
                        job_id,
                        str(JobStatus.RUNNING),
                        row.attempt,
                    ),
                )
                return decision

            return act

        decisions = []
        for job_id, gone in await self._run(candidates):
            decision = await self._transaction(reap_one(job_id, gone))
            if decision is not None:
                decisions.append(decision)
        return decisions

    async def release(self, job_id: str, attempt: int, status: str, *, delay_seconds: float = 0.0) -> bool:
        """Hand back a RUNNING job held by ``attempt``; see the protocol."""
        state = check_releasable(status)

        def act(conn: sqlite3.Connection) -> bool:
            now = time.time()
            cursor = conn.execute(
                f"UPDATE {self.tables.job} SET status = ?, owner = NULL, not_before = ?, updated_at = ?"
                " WHERE id = ? AND attempt = ? AND status = ?",
                (state, now + delay_seconds, now, job_id, attempt, str(JobStatus.RUNNING)),
            )
            return cursor.rowcount == 1

        return await self._transaction(act)


def _append(history: list[dict[str, Any]], entry: dict[str, Any]) -> str:
    return orjson.dumps([*history, entry]).decode()


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _text_ids(rows: Sequence[tuple[bytes, bytes | None]]) -> list[tuple[str, str | None]]:
    """(id, owner) of the rows whose id and owner are UTF-8 text; the others are left out."""
    out: list[tuple[str, str | None]] = []
    for raw_id, raw_owner in rows:
        try:
            out.append((bytes(raw_id).decode(), None if raw_owner is None else bytes(raw_owner).decode()))
        except UnicodeDecodeError:
            continue
    return out
