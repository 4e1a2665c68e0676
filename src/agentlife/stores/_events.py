"""Events sent to jobs (``job send``, `CheckpointStore.send_event`) and taken by ``ctx.wait_for_event``.

An event is a row of the ``job_event`` table: job id, name, JSON payload, the order it was sent in
(``seq``) and, once a wait took it, ``taken_by``: the invocation id of that wait. Events are kept until a
wait of their name takes them, oldest first, so an event sent before the wait, or under a name nothing waits
for yet, is not lost. A wait takes an event in one conditional write bound to its invocation id: a process
that dies after the take and before it journaled the outcome finds the same event again under the same
invocation id, so every event is delivered to exactly one wait, once.

Sending locks the job row, refuses an unknown (`JobNotFound`) or terminal (`JobStateConflict`) job, and
wakes a job parked WAITING for that name (``not_before`` now, and on PostgreSQL ``NOTIFY`` in the same
transaction). Parking (`CheckpointStore.park_waiting`) locks the row too and checks for an event already
sent, so an event sent while the job parks is never left without a wake-up.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from agentlife._exceptions import AttemptFenced, ConfigError, JobNotFound, JobStateConflict
from agentlife._replay import check_replayable
from agentlife.stores._base import JobStatus, TableNames
from agentlife.stores._jobs import TERMINAL
from agentlife.stores._pg_statements import notify_call

__all__ = [
    "MAX_EVENT_NAME_CHARS",
    "MAX_EVENT_PAYLOAD_BYTES",
    "MAX_KEPT_EVENTS",
    "PostgresEventOps",
    "SQLiteEventOps",
    "check_event",
    "check_event_name",
    "pg_event_schema",
    "sqlite_event_schema",
    "waits_for",
]

_T = TypeVar("_T")

#: The largest payload an event may carry (its JSON): it is journaled as the wait's outcome.
MAX_EVENT_PAYLOAD_BYTES = 256 * 1024
#: The longest event name.
MAX_EVENT_NAME_CHARS = 200
#: The most events a job may keep that no wait has taken: a sender looping on a job that never waits for
#: its name is refused rather than allowed to grow the table without end.
MAX_KEPT_EVENTS = 1000


def check_event_name(name: object) -> None:
    """`ConfigError` saying why, unless ``name`` is a usable event name."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_EVENT_NAME_CHARS:
        raise ConfigError(f"an event name is a non-empty string of at most {MAX_EVENT_NAME_CHARS} characters")
    if not name.isprintable():
        raise ConfigError(f"event name {name!r} holds control characters")


def check_event(name: object, payload: Any) -> bytes:
    """The payload's JSON when ``name`` and ``payload`` make an event, else `ConfigError` saying why."""
    check_event_name(name)
    try:
        check_replayable(payload, "the event's payload")
        data = orjson.dumps(payload)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"the event's payload is not JSON the journal can hold: {exc}") from None
    if len(data) > MAX_EVENT_PAYLOAD_BYTES:
        raise ConfigError(
            f"the event's payload is {len(data)} bytes of JSON, more than {MAX_EVENT_PAYLOAD_BYTES}"
        )
    return data


def waits_for(waiting: Any, name: str) -> bool:
    """Whether a row's ``waiting`` column (decoded or JSON text) names the event ``name``."""
    if isinstance(waiting, str | bytes):
        try:
            waiting = orjson.loads(waiting)
        except orjson.JSONDecodeError:
            return False
    events = waiting.get("events") if isinstance(waiting, dict) else None
    return isinstance(events, list) and name in events


def _index_name(table: str, suffix: str) -> tuple[str, str]:
    schema, _, base = table.rpartition(".")
    return f"{schema + '.' if schema else ''}{base}_{suffix}", base


def sqlite_event_schema(t: TableNames) -> list[str]:
    """The event table and its index (SQLite)."""
    index, base = _index_name(t.event, "job_name")
    return [
        f"""CREATE TABLE IF NOT EXISTS {t.event} (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id TEXT NOT NULL,
            name TEXT NOT NULL,
            payload TEXT,
            sent_at REAL NOT NULL,
            taken_by TEXT
        )""",
        f"CREATE INDEX IF NOT EXISTS {index} ON {base} (job_id, name, seq)",
    ]


def pg_event_schema(t: TableNames) -> tuple[str, ...]:
    """The event table and its index (PostgreSQL, by ``db init``)."""
    base = t.event.split(".")[-1]
    return (
        f"""CREATE TABLE IF NOT EXISTS {t.event} (
            seq bigserial PRIMARY KEY,
            job_id text NOT NULL,
            name text NOT NULL,
            payload jsonb,
            sent_at timestamptz NOT NULL DEFAULT now(),
            taken_by text
        )""",
        f"CREATE INDEX IF NOT EXISTS {base}_job_name_idx ON {t.event} (job_id, name, seq)",
    )


def _refuse(job_id: str, name: str, status: str | None) -> None:
    if status is None:
        raise JobNotFound(f"job {job_id} does not exist")
    if status in TERMINAL:
        raise JobStateConflict(f"cannot send {name!r} to job {job_id}: it is {status}")


def _refuse_full(job_id: str, kept: int) -> None:
    if kept >= MAX_KEPT_EVENTS:
        raise JobStateConflict(
            f"job {job_id} already keeps {kept} events no wait has taken (at most {MAX_KEPT_EVENTS});"
            " nothing was sent"
        )


def _kept(rows: Sequence[Any]) -> dict[str, int]:
    return {str(name): int(count) for name, count in rows}


class SQLiteEventOps:
    """`send_event` and `take_event`, mixed into `SQLiteStore` (which provides the attributes below)."""

    tables: TableNames

    if TYPE_CHECKING:

        async def _transaction(self, fn: Callable[[sqlite3.Connection], _T]) -> _T: ...

    async def send_event(self, job_id: str, name: str, payload: Any = None) -> int:
        """Keep an event for the job and wake it if it waits for ``name``; see `CheckpointStore`."""
        data = check_event(name, payload).decode()
        t = self.tables

        def act(conn: sqlite3.Connection) -> int:
            found = conn.execute(f"SELECT status, waiting FROM {t.job} WHERE id = ?", (job_id,)).fetchone()
            _refuse(job_id, name, None if found is None else found[0])
            kept = conn.execute(
                f"SELECT count(*) FROM {t.event} WHERE job_id = ? AND taken_by IS NULL", (job_id,)
            ).fetchone()[0]
            _refuse_full(job_id, kept)
            now = time.time()
            cursor = conn.execute(
                f"INSERT INTO {t.event} (job_id, name, payload, sent_at) VALUES (?, ?, ?, ?)",
                (job_id, name, data, now),
            )
            if found[0] == JobStatus.WAITING and waits_for(found[1], name):
                conn.execute(f"UPDATE {t.job} SET not_before = ? WHERE id = ?", (now, job_id))
            return int(cursor.lastrowid or 0)

        return await self._transaction(act)

    async def take_event(
        self,
        job_id: str,
        attempt: int,
        names: Sequence[str],
        invocation_id: str,
        *,
        sent_by: float | None = None,
    ) -> tuple[str, Any] | None:
        """The event the wait ``invocation_id`` took, else the oldest untaken of ``names``; see the protocol.

        Fenced by ``attempt``; None when there is no such event (sent by ``sent_by``).
        """
        t = self.tables
        by = math.inf if sent_by is None else sent_by

        def act(conn: sqlite3.Connection) -> tuple[str, Any] | None:
            found = conn.execute(f"SELECT attempt FROM {t.job} WHERE id = ?", (job_id,)).fetchone()
            if found is None or found[0] != attempt:
                raise AttemptFenced(f"job {job_id}: event taken by attempt {attempt} refused")
            taken = conn.execute(
                f"SELECT name, payload FROM {t.event} WHERE job_id = ? AND taken_by = ?",
                (job_id, invocation_id),
            ).fetchone()
            if taken is not None:
                return taken[0], orjson.loads(taken[1])
            marks = ", ".join("?" * len(names))
            oldest = conn.execute(
                f"SELECT seq, name, payload FROM {t.event} WHERE job_id = ? AND taken_by IS NULL"
                f" AND sent_at <= ? AND name IN ({marks}) ORDER BY seq LIMIT 1",
                (job_id, by, *names),
            ).fetchone()
            if oldest is None:
                return None
            conn.execute(f"UPDATE {t.event} SET taken_by = ? WHERE seq = ?", (invocation_id, oldest[0]))
            return oldest[1], orjson.loads(oldest[2])

        return await self._transaction(act)

    async def kept_events(self, job_id: str) -> dict[str, int]:
        """How many events of each name the job keeps that no wait has taken yet."""
        t = self.tables

        def act(conn: sqlite3.Connection) -> dict[str, int]:
            return _kept(
                conn.execute(
                    f"SELECT name, count(*) FROM {t.event} WHERE job_id = ? AND taken_by IS NULL"
                    " GROUP BY name ORDER BY min(seq)",
                    (job_id,),
                ).fetchall()
            )

        return await self._transaction(act)


class PostgresEventOps:
    """`send_event` and `take_event`, mixed into `PostgresStore` (which provides the attributes below)."""

    tables: TableNames

    if TYPE_CHECKING:

        def _ops(self) -> contextlib.AbstractAsyncContextManager[Any]: ...

    async def send_event(self, job_id: str, name: str, payload: Any = None) -> int:
        """Keep an event for the job and wake it if it waits for ``name``; see `CheckpointStore`."""
        data = check_event(name, payload).decode()
        t = self.tables
        async with self._ops() as conn, conn.transaction():
            # The row lock orders this send with a park of the same job (see the module docstring).
            found = await conn.fetchrow(
                f"SELECT status, waiting FROM {t.job} WHERE id = $1 FOR UPDATE", job_id
            )
            _refuse(job_id, name, None if found is None else found["status"])
            _refuse_full(
                job_id,
                await conn.fetchval(
                    f"SELECT count(*) FROM {t.event} WHERE job_id = $1 AND taken_by IS NULL", job_id
                ),
            )
            seq = await conn.fetchval(
                f"INSERT INTO {t.event} (job_id, name, payload) VALUES ($1, $2, $3::jsonb) RETURNING seq",
                job_id,
                name,
                data,
            )
            if found["status"] == JobStatus.WAITING and waits_for(found["waiting"], name):
                await conn.fetchrow(
                    f"UPDATE {t.job} SET not_before = now() WHERE id = $1 RETURNING {notify_call(t)}", job_id
                )
        return int(seq)

    async def take_event(
        self,
        job_id: str,
        attempt: int,
        names: Sequence[str],
        invocation_id: str,
        *,
        sent_by: float | None = None,
    ) -> tuple[str, Any] | None:
        """The event the wait ``invocation_id`` took, else the oldest untaken of ``names``; see the protocol.

        Fenced by ``attempt``; None when there is no such event (sent by ``sent_by``).
        """
        t = self.tables
        by = math.inf if sent_by is None else sent_by
        async with self._ops() as conn, conn.transaction():
            owner = await conn.fetchval(f"SELECT attempt FROM {t.job} WHERE id = $1 FOR UPDATE", job_id)
            if owner != attempt:
                raise AttemptFenced(f"job {job_id}: event taken by attempt {attempt} refused")
            taken = await conn.fetchrow(
                f"SELECT name, payload FROM {t.event} WHERE job_id = $1 AND taken_by = $2",
                job_id,
                invocation_id,
            )
            if taken is None:
                taken = await conn.fetchrow(
                    f"UPDATE {t.event} SET taken_by = $3 WHERE seq = (SELECT seq FROM {t.event}"
                    " WHERE job_id = $1 AND taken_by IS NULL AND name = ANY($2::text[])"
                    " AND EXTRACT(EPOCH FROM sent_at) <= $4::float8 ORDER BY seq LIMIT 1)"
                    " RETURNING name, payload",
                    job_id,
                    list(names),
                    invocation_id,
                    by,
                )
        if taken is None:
            return None
        return taken["name"], orjson.loads(taken["payload"]) if taken["payload"] is not None else None

    async def kept_events(self, job_id: str) -> dict[str, int]:
        """How many events of each name the job keeps that no wait has taken yet."""
        t = self.tables
        async with self._ops() as conn:
            rows = await conn.fetch(
                f"SELECT name, count(*) FROM {t.event} WHERE job_id = $1 AND taken_by IS NULL"
                " GROUP BY name ORDER BY min(seq)",
                job_id,
            )
        return _kept([(row[0], row[1]) for row in rows])
