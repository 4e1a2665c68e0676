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

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentlife._exceptions import AttemptFenced

if TYPE_CHECKING:
    from agentlife.stores._dialect import Row, Tx

__all__ = ["StepRecord", "append_step_records", "load_step_records", "record_params"]

_log = logging.getLogger("agentlife.store")


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


def record_params(records: Sequence[StepRecord], attempt: int) -> dict[str, Any]:
    """The parameters of a write of ``records``: their session, and their steps, seqs and lines as lists.

    Raises:
        ValueError: the records are not all of one session of ``attempt`` (this process's).
    """
    if len({r.session for r in records}) != 1 or any(r.attempt != attempt for r in records):
        raise ValueError("step records are written for one session and attempt at a time")
    return {
        "session": records[0].session,
        "record_steps": [r.step for r in records],
        "record_seqs": [r.seq for r in records],
        "record_data": [r.data for r in records],
    }


async def append_step_records(
    tx: Tx, job_id: str, attempt: int, owner: str, records: Sequence[StepRecord]
) -> None:
    """Store ``records`` if ``attempt`` and ``owner`` still hold the live job; see the module.

    One statement on PostgreSQL, one round trip: a claim waits for it to commit (the row is locked
    ``FOR SHARE``), so the attempt that takes the job over reads the records, and a claim that committed
    first makes the row fail the fence.

    Raises:
        AttemptFenced: another attempt or process holds the job, or it has ended; nothing was written.
        ValueError: the records are not all of one session of ``attempt``.
    """
    if not records:
        return
    params = record_params(records, attempt)
    if not await tx.execute(tx.sql.append_records, job_id=job_id, attempt=attempt, owner=owner, **params):
        raise AttemptFenced(
            f"job {job_id}: step records of attempt {attempt} refused, it no longer holds the job"
        )


async def load_step_records(tx: Tx, job_id: str) -> list[StepRecord]:
    """Every step record the job keeps, oldest writer first (see `StepRecord.order`).

    A row the store cannot read as a record (SQLite keeps what a hand-written ``INSERT`` put there: a key
    that is not an integer, data that is a number) is passed over with a warning: hydration goes on with
    the records it can read, as it does past a damaged line of a session journal.
    """
    records = []
    for row in await tx.fetch(tx.sql.load_records, job_id=job_id):
        record = _record(row)
        if record is None:
            _log.warning("job %s: a step record that is not one (%r) passed over", job_id, tuple(row)[:4])
        else:
            records.append(record)
    return records


def _record(row: Row) -> StepRecord | None:
    keys, data = [row[i] for i in range(4)], row[4]
    if not all(isinstance(key, int) and not isinstance(key, bool) for key in keys):
        return None
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")  # a line a hand-written TEXT value holds
    if not isinstance(data, bytes | bytearray | memoryview):
        return None
    return StepRecord(keys[0], keys[1], keys[2], keys[3], bytes(data))
