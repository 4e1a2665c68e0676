"""Durable waits on the job row: a job parked at ``ctx.sleep`` is WAITING, with what it waits for.

`CheckpointStore.park_waiting` hands a RUNNING job held by an attempt back as WAITING, in one conditional
write: ``not_before`` is when the wait ends (the claim takes the row once it has passed, like a RETRYING
one) and the ``waiting`` column (JSON) says what it waits for, for ``job show``. `CheckpointStore.get_wait`
reads them back. Nothing else of the job's waits lives on the row: the wait itself, and its outcome, are in
the journal.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from agentlife.stores._base import JobStatus, TableNames
from agentlife.stores._childjobs import job_ids_waited_for, pg_children_done, sqlite_children_done
from agentlife.stores._pg_statements import notify_call

__all__ = ["PostgresWaitOps", "SQLiteWaitOps", "WaitState", "pg_wait_schema"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class WaitState:
    """A job row's status and, while it is WAITING, what it waits for."""

    status: str
    """The row's status (a `JobStatus` value)."""
    until: float | None = None
    """Unix time the wait ends (the row's ``not_before``), or None when the row is not WAITING."""
    waiting_for: dict[str, Any] = field(default_factory=dict)
    """What the job waits for (``kind``, ``until``, ``invocation_id``), or an empty dict."""

    @classmethod
    def of(cls, status: str, until: float | None, raw: Any) -> WaitState:
        """From the row's columns; a ``waiting`` column that is not a JSON object reads as empty."""
        if status != JobStatus.WAITING:
            return cls(status)
        try:
            value = orjson.loads(raw) if isinstance(raw, str | bytes) else raw
        except orjson.JSONDecodeError:
            value = None
        return cls(status, until, value if isinstance(value, dict) else {})


#: Whether an event of one of the names is waiting to be taken (SQLite; ``{event}``, ``{names}`` filled in).
_SENT = "SELECT 1 FROM {event} WHERE job_id = ? AND taken_by IS NULL AND name IN ({names}) LIMIT 1"


def _event_names(waiting_for: dict[str, Any]) -> list[str]:
    events = waiting_for.get("events")
    return [n for n in events if isinstance(n, str)] if isinstance(events, list) else []


def pg_wait_schema(t: TableNames) -> tuple[str, ...]:
    """The ``waiting`` column (added to an older table too, by ``db init``)."""
    return (f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS waiting jsonb",)


class SQLiteWaitOps:
    """`park_waiting` and `get_wait`, mixed into `SQLiteStore` (which provides the attributes below)."""

    tables: TableNames

    if TYPE_CHECKING:

        async def _transaction(self, fn: Callable[[sqlite3.Connection], _T]) -> _T: ...

        async def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T: ...

    async def park_waiting(
        self, job_id: str, attempt: int, until: float, waiting_for: dict[str, Any]
    ) -> bool:
        """RUNNING (held by ``attempt``) -> WAITING until ``until``; False when the row was not that."""
        data = orjson.dumps(waiting_for).decode()

        names, jobs = _event_names(waiting_for), job_ids_waited_for(waiting_for)

        def act(conn: sqlite3.Connection) -> bool:
            now, due = time.time(), until
            if (
                names
                and conn.execute(
                    _SENT.format(event=self.tables.event, names=", ".join("?" * len(names))), (job_id, *names)
                ).fetchone()
            ):
                due = now  # sent while the job was parking: runnable at once
            if jobs and sqlite_children_done(conn, self.tables.job, jobs):
                due = now  # its children ended while it was parking: runnable at once
            cursor = conn.execute(
                f"UPDATE {self.tables.job} SET status = ?, owner = NULL, not_before = ?, waiting = ?,"
                " updated_at = ? WHERE id = ? AND attempt = ? AND status = ?",
                (str(JobStatus.WAITING), due, data, now, job_id, attempt, str(JobStatus.RUNNING)),
            )
            return cursor.rowcount == 1

        return await self._transaction(act)

    async def get_wait(self, job_id: str) -> WaitState | None:
        """The row's status and what it waits for, or None when there is no such job."""

        def read(conn: sqlite3.Connection) -> WaitState | None:
            found = conn.execute(
                f"SELECT status, not_before, waiting FROM {self.tables.job} WHERE id = ?", (job_id,)
            ).fetchone()
            return None if found is None else WaitState.of(found[0], found[1], found[2])

        return await self._run(read)


class PostgresWaitOps:
    """`park_waiting` and `get_wait`, mixed into `PostgresStore` (which provides the attributes below)."""

    tables: TableNames

    if TYPE_CHECKING:

        def _ops(self) -> contextlib.AbstractAsyncContextManager[Any]: ...

    async def park_waiting(
        self, job_id: str, attempt: int, until: float, waiting_for: dict[str, Any]
    ) -> bool:
        """RUNNING (held by ``attempt``) -> WAITING until ``until``; False when the row was not that.

        A wait already over when it parks (a drain during a short wait's last moment) wakes a listening
        worker in the same statement.
        """
        j, names, jobs = self.tables.job, _event_names(waiting_for), job_ids_waited_for(waiting_for)
        statement = (
            f"UPDATE {j} SET status = 'WAITING', owner = NULL, not_before = to_timestamp($3),"
            " waiting = $4::jsonb, updated_at = now() WHERE id = $1 AND attempt = $2 AND status = 'RUNNING'"
            f" RETURNING 1, CASE WHEN to_timestamp($3) <= now() THEN {notify_call(self.tables)} END"
        )
        sent = (
            f"SELECT 1 FROM {self.tables.event}"
            " WHERE job_id = $1 AND taken_by IS NULL AND name = ANY($2::text[]) LIMIT 1"
        )
        async with self._ops() as conn, conn.transaction():
            # The row lock first, then a fresh look at the events: a send that held the lock has committed.
            await conn.execute(f"SELECT 1 FROM {j} WHERE id = $1 FOR UPDATE", job_id)
            if names and await conn.fetchval(sent, job_id, names):
                until = 0.0  # sent while the job was parking: runnable at once
            if jobs and await pg_children_done(conn, j, jobs):
                until = 0.0  # its children ended while it was parking: runnable at once
            found = await conn.fetchrow(statement, job_id, attempt, until, orjson.dumps(waiting_for).decode())
        return found is not None

    async def get_wait(self, job_id: str) -> WaitState | None:
        """The row's status and what it waits for, or None when there is no such job."""
        statement = (
            f"SELECT status, EXTRACT(EPOCH FROM not_before)::float8 AS until, waiting FROM {self.tables.job}"
            " WHERE id = $1"
        )
        async with self._ops() as conn:
            found = await conn.fetchrow(statement, job_id)
        return None if found is None else WaitState.of(found["status"], found["until"], found["waiting"])
