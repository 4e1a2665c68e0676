"""Rewinding a job to the checkpoint it had after a step, in place or into a new job (a fork).

`kept_checkpoints` reads what a rewind can go back to: the job's checkpoint history (the last
`HISTORY_KEEP` checkpoints). `rewind` does it under the row lock, conditional on the attempt the operator
planned against, so of two operators (or an operator and a claiming worker) one wins and the other gets
`JobStateConflict`:

- in place: the row takes the rewound checkpoint (a new checkpoint id: no marker of a session journal
  names it, so no pod replays a call of the job's old future from its journal), becomes PENDING with
  ``attempt + 1`` and no claim token (a process still holding the job is fenced out at its next write);
  the history entries, step records and conversation rows after the step are deleted, so replay never
  returns a result recorded after it;
- a fork (``new_id``): a new PENDING row with the source's agent, payload and budget, the rewound
  checkpoint and the conversation up to the step; the source is not touched.

The crash-history entry records who (``actor``), why and to which step; like a retry it ends the count of
the crashes before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentlife._exceptions import JobStateConflict
from agentlife.stores._base import CLAIM_STALE_AFTER_SECONDS, JobRecord, owner_is_live
from agentlife.stores._jobs import REWIND_EVENT, operator_record
from agentlife.stores._prune import not_found, pruned_job, pruned_message
from agentlife.stores._rows import as_bytes, dumps

if TYPE_CHECKING:
    from agentlife.stores._dialect import Tx

__all__ = ["KeptCheckpoint", "RewindTarget", "kept_checkpoints", "rewind"]


@dataclass(frozen=True, slots=True)
class KeptCheckpoint:
    """One entry of a job's checkpoint history."""

    checkpoint_id: str
    step: int
    data: bytes
    crc: int


@dataclass(frozen=True, slots=True)
class RewindTarget:
    """What a rewind writes: planned by `agentlife._jobs._rewind` against ``attempt`` of the row."""

    to_step: int
    attempt: int
    source_checkpoint_id: str
    checkpoint_id: str
    data: bytes
    crc: int
    length: int
    """The conversation's length at the step: rows from this ``seq`` on are the old future."""


async def kept_checkpoints(tx: Tx, job_id: str) -> list[KeptCheckpoint]:
    """The job's checkpoint history, newest first (unverified: the caller checks each CRC)."""
    rows = await tx.fetch(tx.sql.history, job_id=job_id)
    kept = []
    for row in rows:
        step, crc = row[3], row[2]
        if isinstance(step, int) and isinstance(crc, int) and row[0] is not None and row[1] is not None:
            kept.append(KeptCheckpoint(str(row[0]), step, as_bytes(row[1]), crc))
    return kept


async def rewind(
    tx: Tx,
    job_id: str,
    target: RewindTarget,
    *,
    actor: str,
    reason: str,
    force: bool = False,
    new_id: str | None = None,
) -> JobRecord:
    """Rewind ``job_id`` to ``target`` (or fork it into ``new_id``); see the module. The row it left.

    Raises:
        JobNotFound: no such job.
        JobStateConflict: the row changed since the rewind was planned, a live worker holds it and
            ``force`` is not set, or ``new_id`` exists.
    """
    async with tx.atomic():
        locked = await tx.fetchrow(tx.sql.lock_row, job_id=job_id)
        if locked is None:
            raise await not_found(tx, job_id)
        row = tx.job(locked)
        if row.attempt != target.attempt:
            raise JobStateConflict(
                f"cannot rewind job {job_id}: it changed since the rewind was planned (attempt "
                f"{target.attempt}, now {row.attempt}: another operator or a worker acted first); look again"
            )
        if not any(
            k.checkpoint_id == target.source_checkpoint_id for k in await kept_checkpoints(tx, job_id)
        ):
            raise JobStateConflict(
                f"cannot rewind job {job_id}: the checkpoint of step {target.to_step} is gone"
            )
        note = f"rewound to step {target.to_step}" + (f": {reason}" if reason else "")
        if new_id is not None:
            return await _fork(tx, job_id, new_id, target, actor=actor, note=note, reason=reason)
        live = owner_is_live(locked["owner"], locked["heartbeat_age"], CLAIM_STALE_AFTER_SECONDS)
        if live and not force:
            raise JobStateConflict(
                f"cannot rewind job {job_id}: a live worker holds it ({row.status}); --force fences it out "
                "(attempt + 1: its next write fails and it stops)"
            )
        entry = {
            **operator_record("Rewound", note, row.attempt, tx.now, actor=actor),
            "event": REWIND_EVENT,
            "to_step": target.to_step,
            "reason": reason,
            "checkpoint_id": target.checkpoint_id,
            **({"fenced": True} if live else {}),
        }
        changed = await tx.execute(
            tx.sql.rewind_job,
            job_id=job_id,
            attempt=target.attempt,
            data=target.data,
            crc=target.crc,
            checkpoint_id=target.checkpoint_id,
            history=dumps([*row.error, entry]),
        )
        if not changed:  # not reachable under the lock; a conflict rather than a wrong success
            raise JobStateConflict(f"cannot rewind job {job_id}: it changed meanwhile; look again")
        await _cut_future(tx, job_id, target)
        return await _row(tx, job_id)


async def _cut_future(tx: Tx, job_id: str, target: RewindTarget) -> None:
    """Delete what was recorded after the step; keep the rewound checkpoint as the newest history entry."""
    step = target.to_step
    await tx.execute(tx.sql.rewind_cut_history, job_id=job_id, step=step)
    await tx.execute(tx.sql.rewind_cut_records, job_id=job_id, step=step)
    await tx.execute(tx.sql.rewind_cut_messages, job_id=job_id, length=target.length)
    await _add_history(tx, job_id, target)


async def _add_history(tx: Tx, job_id: str, target: RewindTarget) -> None:
    await tx.execute(
        tx.sql.rewind_add_history,
        job_id=job_id,
        checkpoint_id=target.checkpoint_id,
        step=target.to_step,
        data=target.data,
        crc=target.crc,
    )


async def _fork(
    tx: Tx, job_id: str, new_id: str, target: RewindTarget, *, actor: str, note: str, reason: str
) -> JobRecord:
    entry = {
        **operator_record("Forked", f"forked from job {job_id}, {note}", 0, tx.now, actor=actor),
        "event": REWIND_EVENT,
        "to_step": target.to_step,
        "reason": reason,
        "source": job_id,
        "checkpoint_id": target.checkpoint_id,
    }
    created = await tx.execute(
        tx.sql.fork_job,
        job_id=job_id,
        new_id=new_id,
        data=target.data,
        crc=target.crc,
        checkpoint_id=target.checkpoint_id,
        history=dumps([entry]),
    )
    if not created:
        tomb = await pruned_job(tx, new_id)
        said = f"job {new_id} already exists" if tomb is None else pruned_message(new_id, tomb)
        raise JobStateConflict(f"cannot fork job {job_id} into {new_id}: {said}")
    await _add_history(tx, new_id, target)
    await tx.execute(tx.sql.fork_messages, job_id=job_id, new_id=new_id, length=target.length)
    return await _row(tx, new_id)


async def _row(tx: Tx, job_id: str) -> JobRecord:
    row = await tx.fetchrow(tx.sql.get_job, job_id=job_id)
    assert row is not None
    return tx.job(row)
