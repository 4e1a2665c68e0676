"""Child jobs on the job table: who started a row, and the parent's wake-up when its last child ends.

Three columns of the job row: ``parent_id`` (the job that started it), ``spawned_by`` (the invocation id of
the starting call) and ``detached`` (not cancelled with the parent). `CheckpointStore.start_child` inserts
the row if absent, keyed on its id, in one write fenced by the parent's attempt: a start re-run after a
crash finds its own row (same parent, same call) and creates nothing; a row of any other origin is a
`ChildJobError`.

A parent parked at ``ctx.wait_for_jobs`` is WAITING with ``{"jobs": [ids]}`` in its ``waiting`` column.
Every write that ends a child (finish, cancel, reject, the reaper's verdict, a worker setting a row aside,
an operator's or a control plane's own UPDATE) wakes the parent in the same statement, through a trigger on
the job table: when the child's status becomes terminal and every job the parent waits for has ended, the
parent's ``not_before`` becomes now (and on PostgreSQL a ``NOTIFY`` wakes an idle worker of its agent). The
trigger locks the parent row before it looks at the siblings, so two children ending at once cannot both
miss the last one. Parking (`CheckpointStore.park_waiting`) locks the row too and looks at the children
itself, so a child that ended while the parent parked is not left without a wake-up.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from agentlife._exceptions import AttemptFenced, ChildJobError, JobNotFound, JobStateConflict
from agentlife._jobrefs import JobOutcome
from agentlife.stores._base import JobRecord, JobStatus, TableNames
from agentlife.stores._jobs import TERMINAL
from agentlife.stores._pg_statements import notify_call

if TYPE_CHECKING:
    from agentlife.stores._base import CheckpointStore

__all__ = [
    "MAX_CANCEL_TREE",
    "JobFamily",
    "PostgresChildOps",
    "SQLiteChildOps",
    "cancel_with_children",
    "job_ids_waited_for",
    "pg_child_schema",
    "sqlite_child_columns",
    "sqlite_child_schema",
]

_T = TypeVar("_T")
_TERMINAL_SQL = ", ".join(f"'{s}'" for s in TERMINAL)
#: The most jobs one ``job cancel`` walks through (a parent, its children, theirs ...).
MAX_CANCEL_TREE = 10_000


@dataclass(frozen=True, slots=True)
class JobFamily:
    """Where a job stands among child jobs: its parent, and the children it started."""

    parent_id: str | None = None
    """The job that started this one, or None."""
    spawned_by: str | None = None
    """The invocation id of the parent's call that started it."""
    detached: bool = False
    """Started detached: not cancelled with its parent."""
    children: list[tuple[str, str, bool]] = field(default_factory=list)
    """The jobs it started: (id, status, detached), in id order."""


def job_ids_waited_for(waiting_for: Any) -> list[str]:
    """The job ids a ``waiting`` column (decoded) names under ``jobs``; [] for anything else."""
    jobs = waiting_for.get("jobs") if isinstance(waiting_for, dict) else None
    return [j for j in jobs if isinstance(j, str)] if isinstance(jobs, list) else []


def _outcome(
    job_id: str,
    status: str,
    result: Any,
    error: Any,
    *,
    ended_at: float | None = None,
    ended_by: float | None = None,
) -> JobOutcome:
    """A child's outcome from its row's columns (JSON text or decoded); what does not decode is left out.

    A child that ended after ``ended_by`` (its row last written then: a terminal row is never rewritten)
    stood unfinished at that time; which status it had then is not kept, so it reads ``RUNNING``.
    """
    if status in TERMINAL and ended_by is not None and not _ended_by(ended_at, ended_by):
        return JobOutcome(job_id=job_id, status=str(JobStatus.RUNNING))
    result, history = _decoded(result), _decoded(error)
    return JobOutcome(
        job_id=job_id,
        status=str(status),
        result=result if status in TERMINAL else None,
        error=None if status == JobStatus.COMPLETED or status not in TERMINAL else _last_error(history),
    )


def _ended_by(ended_at: Any, deadline: float) -> bool:
    """Whether a row written at ``ended_at`` (unix time; anything else from another client) ended by then."""
    if isinstance(ended_at, bool) or not isinstance(ended_at, int | float) or math.isnan(ended_at):
        return True  # no usable time: the end is taken as it is rather than held back for ever
    return ended_at <= deadline


def _decoded(value: Any) -> Any:
    if isinstance(value, memoryview):
        value = bytes(value)
    if isinstance(value, str | bytes):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    return value


def _last_error(history: Any) -> str | None:
    if not isinstance(history, list):
        return None
    for entry in reversed(history):
        if isinstance(entry, dict) and entry.get("message") is not None:
            kind = entry.get("error_class")
            text = " ".join(str(entry["message"]).split())[:500]
            return f"{kind}: {text}" if isinstance(kind, str) and kind else text
    return None


def _check_parentage(parent_id: str, wanted: Sequence[str], found: dict[str, str | None]) -> None:
    for job_id in wanted:
        if job_id not in found:
            raise ChildJobError(f"ctx.wait_for_jobs: job {job_id} does not exist")
        if found[job_id] != parent_id:
            raise ChildJobError(f"ctx.wait_for_jobs: job {job_id} is not a child of job {parent_id}")


def _check_existing(job_id: str, agent_id: str, parent_id: str, invocation_id: str, row: Any) -> None:
    """`ChildJobError` unless the existing row ``(agent, parent, spawned_by)`` is the child of this call."""
    agent, parent, spawned_by = row
    if parent != parent_id or spawned_by != invocation_id:
        raise ChildJobError(
            f"ctx.start_job: job {job_id} already exists and was not started by this call ({invocation_id})"
        )
    if agent != agent_id:
        raise ChildJobError(f"ctx.start_job: job {job_id} exists for agent {agent}, not {agent_id}")


# -- SQLite -------------------------------------------------------------------------------------------------


def sqlite_child_columns() -> list[tuple[str, str]]:
    """The columns (name, type) ``init_schema`` adds to a job table that lacks them."""
    return [("parent_id", "TEXT"), ("spawned_by", "TEXT"), ("detached", "INTEGER NOT NULL DEFAULT 0")]


def sqlite_child_schema(t: TableNames) -> list[str]:
    """The parent index and the trigger that wakes a parent when its last child ends (SQLite)."""
    schema, _, base = t.job.rpartition(".")
    prefix = f"{schema}." if schema else ""
    # Trigger bodies take unqualified table names. The parent's column is named with its table: bare, inside
    # the subquery that joins the children it would be the child's. A column that is not JSON, or whose
    # ``jobs`` is not a list, reads as waiting for nothing (CASE, not AND: json_type refuses bad JSON).
    waiting = f"{base}.waiting"
    jobs = (
        f"json_each(CASE WHEN NOT json_valid({waiting}) THEN '{{}}'"
        f" WHEN json_type({waiting}, '$.jobs') = 'array' THEN {waiting} ELSE '{{}}' END, '$.jobs')"
    )
    return [
        f"CREATE INDEX IF NOT EXISTS {prefix}{base}_parent ON {base} (parent_id) WHERE parent_id IS NOT NULL",
        # The first version of this trigger read the child's column in its second check (so a parent woke
        # while another child still ran, and replayed only to park again): replaced, under a new name so
        # the two never leave a moment without one.
        f"""CREATE TRIGGER IF NOT EXISTS {prefix}{base}_wakes_parent AFTER UPDATE OF status ON {base}
        WHEN NEW.parent_id IS NOT NULL AND NEW.status IN ({_TERMINAL_SQL})
            AND OLD.status IS NOT NEW.status
        BEGIN
            UPDATE {base} SET not_before = (julianday('now') - 2440587.5) * 86400.0
            WHERE id = NEW.parent_id AND status = 'WAITING'
                AND EXISTS (SELECT 1 FROM {jobs} WHERE value = NEW.id)
                AND NOT EXISTS (
                    SELECT 1 FROM {jobs} AS w JOIN {base} AS c ON c.id = w.value
                    WHERE c.status NOT IN ({_TERMINAL_SQL})
                );
        END""",
        f"DROP TRIGGER IF EXISTS {prefix}{base}_child_ended",
    ]


def sqlite_children_done(conn: sqlite3.Connection, table: str, job_ids: Sequence[str]) -> bool:
    """Whether every job of ``job_ids`` has ended (inside the caller's transaction)."""
    ids = sorted(set(job_ids))
    if not ids:
        return False
    (ended,) = conn.execute(
        f"SELECT count(*) FROM {table} WHERE id IN ({', '.join('?' * len(ids))})"
        f" AND status IN ({_TERMINAL_SQL})",
        ids,
    ).fetchone()
    return int(ended) == len(ids)


class SQLiteChildOps:
    """`start_child`, `child_outcomes` and `get_family`, mixed into `SQLiteStore`."""

    tables: TableNames
    owner: str

    if TYPE_CHECKING:

        async def _transaction(self, fn: Callable[[sqlite3.Connection], _T]) -> _T: ...

        async def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T: ...

    async def start_child(
        self,
        parent_id: str,
        attempt: int,
        job_id: str,
        agent_id: str,
        payload: Any,
        *,
        invocation_id: str,
        detached: bool = False,
    ) -> bool:
        """Create the child row if absent; True when this call created it. See the protocol."""
        data = orjson.dumps(payload).decode()
        j = self.tables.job

        def act(conn: sqlite3.Connection) -> bool:
            held = conn.execute(
                f"SELECT 1 FROM {j} WHERE id = ? AND attempt = ? AND (owner IS NULL OR owner = ?)",
                (parent_id, attempt, self.owner),
            ).fetchone()
            if held is None:
                raise AttemptFenced(f"job {parent_id}: child start by attempt {attempt} refused")
            existing = conn.execute(
                f"SELECT agent_id, parent_id, spawned_by FROM {j} WHERE id = ?", (job_id,)
            ).fetchone()
            if existing is not None:
                _check_existing(job_id, agent_id, parent_id, invocation_id, existing)
                return False
            now = time.time()
            conn.execute(
                f"INSERT INTO {j} (id, agent_id, status, payload, attempt, updated_at, not_before,"
                " parent_id, spawned_by, detached) VALUES (?, ?, ?, ?, 0, ?, ?, ?, ?, ?)",
                (job_id, agent_id, "PENDING", data, now, now, parent_id, invocation_id, detached),
            )
            return True

        return await self._transaction(act)

    async def child_outcomes(
        self, parent_id: str, job_ids: Sequence[str], *, ended_by: float | None = None
    ) -> list[JobOutcome]:
        """Each child's status, result and error, in the order of ``job_ids``. See the protocol."""
        ids = sorted(set(job_ids))
        j = self.tables.job

        def read(conn: sqlite3.Connection) -> list[JobOutcome]:
            rows = conn.execute(
                "SELECT id, parent_id, status, CAST(result AS BLOB), CAST(error AS BLOB), updated_at"
                f" FROM {j} WHERE id IN ({', '.join('?' * len(ids))})",
                ids,
            ).fetchall()
            _check_parentage(parent_id, job_ids, {r[0]: r[1] for r in rows})
            by_id = {r[0]: _outcome(r[0], r[2], r[3], r[4], ended_at=r[5], ended_by=ended_by) for r in rows}
            return [by_id[i] for i in job_ids]

        return await self._run(read)

    async def get_family(self, job_id: str) -> JobFamily | None:
        """The job's parent and the children it started; None when there is no such job."""
        j = self.tables.job

        def read(conn: sqlite3.Connection) -> JobFamily | None:
            found = conn.execute(
                f"SELECT parent_id, spawned_by, detached FROM {j} WHERE id = ?", (job_id,)
            ).fetchone()
            if found is None:
                return None
            children = conn.execute(
                f"SELECT id, status, detached FROM {j} WHERE parent_id = ? ORDER BY id", (job_id,)
            ).fetchall()
            return JobFamily(found[0], found[1], bool(found[2]), [(c, s, bool(d)) for c, s, d in children])

        return await self._run(read)


# -- PostgreSQL ---------------------------------------------------------------------------------------------


def pg_child_schema(t: TableNames) -> tuple[str, ...]:
    """The columns, the parent index, and the trigger that wakes a parent (``db init``)."""
    schema, _, base = t.job.rpartition(".")
    prefix = f"{schema}." if schema else ""
    function = f"{prefix}agentlife_{base}_child_ended"
    body = f"""
        DECLARE woke text;
        BEGIN
            -- The parent's row lock first: a sibling ending at the same time waits, then sees this one.
            PERFORM 1 FROM {t.job} WHERE id = NEW.parent_id FOR UPDATE;
            UPDATE {t.job} AS p SET not_before = now()
            WHERE p.id = NEW.parent_id AND p.status = 'WAITING'
                AND jsonb_typeof(p.waiting -> 'jobs') = 'array' AND (p.waiting -> 'jobs') ? NEW.id
                AND NOT EXISTS (
                    SELECT 1 FROM {t.job} AS c
                    WHERE c.id IN (SELECT jsonb_array_elements_text(p.waiting -> 'jobs'))
                        AND c.status NOT IN ({_TERMINAL_SQL})
                )
            RETURNING p.agent_id INTO woke;
            IF woke IS NOT NULL THEN
                PERFORM {notify_call(t, "woke")};
            END IF;
            RETURN NULL;
        END"""
    return (
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS parent_id text",
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS spawned_by text",
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS detached boolean NOT NULL DEFAULT false",
        f"CREATE INDEX IF NOT EXISTS {base}_parent_idx ON {t.job} (parent_id) WHERE parent_id IS NOT NULL",
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql"
        f" AS $agentlife${body}$agentlife$",
        f"DROP TRIGGER IF EXISTS {base}_child_ended ON {t.job}",
        f"CREATE TRIGGER {base}_child_ended AFTER UPDATE OF status ON {t.job} FOR EACH ROW"
        f" WHEN (NEW.parent_id IS NOT NULL AND NEW.status IN ({_TERMINAL_SQL})"
        " AND OLD.status IS DISTINCT FROM NEW.status)"
        f" EXECUTE FUNCTION {function}()",
    )


async def pg_children_done(conn: Any, table: str, job_ids: Sequence[str]) -> bool:
    """Whether every job of ``job_ids`` has ended (inside the caller's transaction)."""
    ids = sorted(set(job_ids))
    if not ids:
        return False
    ended = await conn.fetchval(
        f"SELECT count(*) FROM {table} WHERE id = ANY($1::text[]) AND status IN ({_TERMINAL_SQL})", ids
    )
    return int(ended) == len(ids)


class PostgresChildOps:
    """`start_child`, `child_outcomes` and `get_family`, mixed into `PostgresStore`."""

    tables: TableNames
    owner: str

    if TYPE_CHECKING:

        def _ops(self) -> contextlib.AbstractAsyncContextManager[Any]: ...

    async def start_child(
        self,
        parent_id: str,
        attempt: int,
        job_id: str,
        agent_id: str,
        payload: Any,
        *,
        invocation_id: str,
        detached: bool = False,
    ) -> bool:
        """Create the child row if absent; True when this call created it. See the protocol."""
        t = self.tables
        # One statement: fenced by the parent's attempt and claim token, a no-op on an existing id, and a
        # wake-up for the child agent's idle workers when it inserted.
        insert = (
            f"WITH created AS (INSERT INTO {t.job} (id, agent_id, status, payload, attempt, updated_at,"
            " parent_id, spawned_by, detached)"
            " SELECT $1, $2, 'PENDING', $3::jsonb, 0, now(), $4, $5, $6"
            f" WHERE EXISTS (SELECT 1 FROM {t.job} WHERE id = $4 AND attempt = $7"
            " AND (owner IS NULL OR owner = $8))"
            f" ON CONFLICT (id) DO NOTHING RETURNING agent_id) SELECT {notify_call(t)} FROM created"
        )
        args = (job_id, agent_id, orjson.dumps(payload).decode(), parent_id, invocation_id, detached)
        async with self._ops() as conn:
            created = await conn.fetch(insert, *args, attempt, self.owner)
            if created:
                return True
            existing = await conn.fetchrow(
                f"SELECT agent_id, parent_id, spawned_by FROM {t.job} WHERE id = $1", job_id
            )
        if existing is None:
            raise AttemptFenced(f"job {parent_id}: child start by attempt {attempt} refused")
        _check_existing(job_id, agent_id, parent_id, invocation_id, tuple(existing))
        return False

    async def child_outcomes(
        self, parent_id: str, job_ids: Sequence[str], *, ended_by: float | None = None
    ) -> list[JobOutcome]:
        """Each child's status, result and error, in the order of ``job_ids``. See the protocol."""
        async with self._ops() as conn:
            rows = await conn.fetch(
                f"SELECT id, parent_id, status, result::text AS result, error::text AS error,"
                f" EXTRACT(EPOCH FROM updated_at)::float8 AS ended_at"
                f" FROM {self.tables.job} WHERE id = ANY($1::text[])",
                sorted(set(job_ids)),
            )
        _check_parentage(parent_id, job_ids, {r["id"]: r["parent_id"] for r in rows})
        by_id = {
            r["id"]: _outcome(
                r["id"], r["status"], r["result"], r["error"], ended_at=r["ended_at"], ended_by=ended_by
            )
            for r in rows
        }
        return [by_id[i] for i in job_ids]

    async def get_family(self, job_id: str) -> JobFamily | None:
        """The job's parent and the children it started; None when there is no such job."""
        j = self.tables.job
        async with self._ops() as conn:
            found = await conn.fetchrow(
                f"SELECT parent_id, spawned_by, detached FROM {j} WHERE id = $1", job_id
            )
            if found is None:
                return None
            children = await conn.fetch(
                f"SELECT id, status, detached FROM {j} WHERE parent_id = $1 ORDER BY id", job_id
            )
        return JobFamily(
            found["parent_id"],
            found["spawned_by"],
            bool(found["detached"]),
            [(c["id"], c["status"], bool(c["detached"])) for c in children],
        )


# -- cancel ----------------------------------------------------------------------------------------------


async def cancel_with_children(
    store: CheckpointStore, job_id: str, reason: str
) -> tuple[JobRecord, list[JobRecord]]:
    """Cancel ``job_id`` (`CheckpointStore.cancel`), then its children that are not detached, recursively.

    The job first: a parent cancelled is fenced out and starts nothing more, and its children's ends wake
    nobody. A child that has ended, or ends meanwhile, is left as it is. Returns the job's row and the rows
    of the children cancelled.

    Raises:
        JobNotFound, JobStateConflict: the job itself cannot be cancelled; nothing changed.
    """
    row = await store.cancel(job_id, reason)
    cancelled: list[JobRecord] = []
    seen, queue = {job_id}, [job_id]
    while queue and len(seen) <= MAX_CANCEL_TREE:
        family = await store.get_family(queue.pop(0))
        for child, status, detached in family.children if family is not None else ():
            if detached or child in seen:  # a hand-made cycle of parents stops here
                continue
            seen.add(child)
            queue.append(child)
            if status in TERMINAL:
                continue
            with contextlib.suppress(JobStateConflict, JobNotFound):  # ended or gone meanwhile
                cancelled.append(await store.cancel(child, f"{reason} (parent {job_id} cancelled)"))
    return row, cancelled
