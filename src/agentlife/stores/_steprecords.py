"""A step's durable record in the store: what a resumed step replays, whichever pod resumes it.

The session journal on a pod's disk holds every event of a step; a pod's disk is not the job's, though
(an ``emptyDir`` goes with the pod, a worker fleet resumes a job wherever a slot is free). So the events a
resumed step needs to replay exactly — the write-ahead start of each side-effecting call, completed calls'
results, wait starts and outcomes — are also rows of the ``step_record`` table: the journal line itself
(masked as it was journaled), keyed by the job, the step, the attempt and session that wrote it and the
line's ``seq`` in that session.

Rows are written by `append_step_records` (fenced like a checkpoint: a process that no longer holds the
job writes nothing and learns so before its side effect), or together with a checkpoint
(`CheckpointStore.write_checkpoint(records=...)`); a checkpoint also removes the rows of steps older than
its window (``prune_before``), so a job keeps the records of its last few steps and a 1 000-step job
never rewrites its history. `load_step_records` reads a job's rows back, oldest writer first.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from agentlife._exceptions import AttemptFenced
from agentlife.stores._base import TableNames
from agentlife.stores._jobs import TERMINAL

__all__ = [
    "PostgresStepRecordOps",
    "SQLiteStepRecordOps",
    "StepRecord",
    "pg_step_record_schema",
    "sqlite_step_record_schema",
]

_T = TypeVar("_T")
_NOT_TERMINAL = f"status NOT IN ({', '.join(repr(str(s)) for s in TERMINAL)})"


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One journal event of a step, as the store keeps it."""

    step: int
    """The step the event belongs to."""
    attempt: int
    """The attempt that wrote it."""
    session: int
    """The writing session's start (unix milliseconds, as in its file name): with ``attempt`` and ``seq``,
    the order in which events were written."""
    seq: int
    """The event's ``seq`` in its session."""
    data: bytes
    """The journal line (a JSON object, masked), without its newline."""

    @property
    def order(self) -> tuple[int, int, int]:
        """Sort key: the writer (attempt, session), then the event's place in its session."""
        return (self.attempt, self.session, self.seq)


def _index_base(table: str) -> tuple[str, str]:
    schema, _, base = table.rpartition(".")
    return (f"{schema}." if schema else ""), base


def sqlite_step_record_schema(t: TableNames) -> list[str]:
    """The ``step_record`` table (SQLite)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {t.step_record} (
            job_id TEXT NOT NULL,
            step INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            session INTEGER NOT NULL,
            seq INTEGER NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (job_id, step, attempt, session, seq)
        )"""
    ]


def pg_step_record_schema(t: TableNames) -> tuple[str, ...]:
    """The ``step_record`` table (PostgreSQL, by ``db init``)."""
    return (
        f"""CREATE TABLE IF NOT EXISTS {t.step_record} (
            job_id text NOT NULL,
            step integer NOT NULL,
            attempt integer NOT NULL,
            session bigint NOT NULL,
            seq integer NOT NULL,
            data bytea NOT NULL,
            PRIMARY KEY (job_id, step, attempt, session, seq)
        )""",
    )


def _rows(job_id: str, records: Sequence[StepRecord]) -> list[tuple[Any, ...]]:
    return [(job_id, r.step, r.attempt, r.session, r.seq, r.data) for r in records]


def _fenced(job_id: str, attempt: int) -> AttemptFenced:
    return AttemptFenced(
        f"job {job_id}: step records of attempt {attempt} refused, it no longer holds the job"
    )


class SQLiteStepRecordOps:
    """`append_step_records` and `load_step_records`, mixed into `SQLiteStore`."""

    tables: TableNames
    owner: str

    if TYPE_CHECKING:

        async def _transaction(self, fn: Callable[[sqlite3.Connection], _T]) -> _T: ...

        async def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T: ...

    def _insert_step_records(
        self, conn: sqlite3.Connection, job_id: str, records: Sequence[StepRecord]
    ) -> None:
        conn.executemany(
            f"INSERT OR IGNORE INTO {self.tables.step_record} (job_id, step, attempt, session, seq, data)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            _rows(job_id, records),
        )

    def _prune_step_records(self, conn: sqlite3.Connection, job_id: str, before: int) -> None:
        conn.execute(f"DELETE FROM {self.tables.step_record} WHERE job_id = ? AND step < ?", (job_id, before))

    async def append_step_records(self, job_id: str, attempt: int, records: Sequence[StepRecord]) -> None:
        """Store ``records`` if ``attempt`` (and this store's claim) still holds the live job; see the module.

        Raises:
            AttemptFenced: another attempt or process holds the job, or it has ended; nothing was written.
        """
        if not records:
            return
        t = self.tables

        def act(conn: sqlite3.Connection) -> None:
            held = conn.execute(
                f"SELECT 1 FROM {t.job} WHERE id = ? AND attempt = ? AND (owner IS NULL OR owner = ?)"
                f" AND {_NOT_TERMINAL}",
                (job_id, attempt, self.owner),
            ).fetchone()
            if held is None:
                raise _fenced(job_id, attempt)
            self._insert_step_records(conn, job_id, records)

        await self._transaction(act)

    async def load_step_records(self, job_id: str) -> list[StepRecord]:
        """Every step record the job keeps, oldest writer first (see `StepRecord.order`)."""

        def read(conn: sqlite3.Connection) -> list[StepRecord]:
            rows = conn.execute(
                f"SELECT step, attempt, session, seq, data FROM {self.tables.step_record} WHERE job_id = ?"
                " ORDER BY attempt, session, seq",
                (job_id,),
            ).fetchall()
            return [StepRecord(int(s), int(a), int(se), int(q), bytes(d)) for s, a, se, q, d in rows]

        return await self._run(read)


class PostgresStepRecordOps:
    """`append_step_records` and `load_step_records`, mixed into `PostgresStore`."""

    tables: TableNames
    _fence_args: tuple[str, ...]

    if TYPE_CHECKING:

        def _connection(self) -> contextlib.AbstractAsyncContextManager[Any]: ...

    def _append_records_sql(self) -> str:
        t = self.tables
        fence = " AND (owner IS NULL OR owner = $7)" if self._fence_args else ""
        # FOR SHARE: a claim of the row waits for this insert to commit, so the attempt that takes the job
        # over reads this record; a claim that committed first makes the row fail the fence here.
        return f"""
            WITH held AS (
                SELECT 1 FROM {t.job} WHERE id = $1 AND attempt = $2{fence} AND {_NOT_TERMINAL} FOR SHARE
            ), stored AS (
                INSERT INTO {t.step_record} (job_id, step, attempt, session, seq, data)
                SELECT $1, r.step, $2, $3, r.seq, r.data
                FROM unnest($4::integer[], $5::integer[], $6::bytea[]) AS r(step, seq, data)
                WHERE EXISTS (SELECT 1 FROM held)
                ON CONFLICT DO NOTHING
                RETURNING 1
            )
            SELECT EXISTS (SELECT 1 FROM held)
        """

    async def append_step_records(self, job_id: str, attempt: int, records: Sequence[StepRecord]) -> None:
        """Store ``records`` if ``attempt`` (and this store's claim) still holds the live job; see the module.

        One statement, one round trip. ``records`` all come from one session (this process's).

        Raises:
            AttemptFenced: another attempt or process holds the job, or it has ended; nothing was written.
        """
        if not records:
            return
        sessions = {r.session for r in records}
        if len(sessions) != 1 or any(r.attempt != attempt for r in records):
            raise ValueError("append_step_records: records of one session and attempt at a time")
        async with self._connection() as conn:
            held = await conn.fetchval(
                self._append_records_sql(),
                job_id,
                attempt,
                records[0].session,
                [r.step for r in records],
                [r.seq for r in records],
                [r.data for r in records],
                *self._fence_args,
            )
        if not held:
            raise _fenced(job_id, attempt)

    async def load_step_records(self, job_id: str) -> list[StepRecord]:
        """Every step record the job keeps, oldest writer first (see `StepRecord.order`)."""
        async with self._connection() as conn:
            rows = await conn.fetch(
                f"SELECT step, attempt, session, seq, data FROM {self.tables.step_record} WHERE job_id = $1"
                " ORDER BY attempt, session, seq",
                job_id,
            )
        return [StepRecord(r[0], r[1], r[2], r[3], bytes(r[4])) for r in rows]
