"""Checkpoints and the conversation: a step's one commit, and what hydration reads back.

A checkpoint write stores the checkpoint's exact bytes with their CRC-32 on the job row, appends it to the
row's history (the last `HISTORY_KEEP`), and in the same commit stores the conversation's new messages, adds
the step's model usage to ``tokens_consumed``, stores the step records of this session, removes those of
steps before the window and sets ``heartbeat_at``. It is fenced by the attempt and the claim token, and
lands on no terminal row. On PostgreSQL it is one statement (one round trip); SQLite runs its statements
in one transaction.

Loading verifies the CRC over the exact stored bytes and falls back to the newest history entry that
verifies (`first_valid_checkpoint`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentlife._exceptions import AttemptFenced
from agentlife.stores._base import LoadedCheckpoint, StepUsage, crc32, first_valid_checkpoint
from agentlife.stores._prune import not_found
from agentlife.stores._rows import as_bytes
from agentlife.stores._steprecords import StepRecord, record_params

if TYPE_CHECKING:
    from agentlife.stores._dialect import Tx

__all__ = ["load_checkpoint", "load_conversation", "write_checkpoint"]


async def load_checkpoint(tx: Tx, job_id: str) -> LoadedCheckpoint | None:
    """The newest checkpoint that verifies, falling back to history; None for a fresh job.

    Raises:
        JobNotFound: no such row.
        CheckpointCorrupt: a checkpoint exists but neither it nor any history entry verifies.
    """
    row = await tx.fetchrow(tx.sql.load, job_id=job_id)
    if row is None:
        raise await not_found(tx, job_id)
    data, crc, checkpoint_id = row[0], row[1], row[2]
    if data is None:
        return None
    if crc32(bytes(data)) == crc:
        return LoadedCheckpoint(checkpoint_id, bytes(data), crc, "job")
    history = await tx.fetch(tx.sql.history, job_id=job_id)
    return first_valid_checkpoint(job_id, [(r[0], r[1], r[2], r[3]) for r in history])


async def write_checkpoint(
    tx: Tx,
    job_id: str,
    attempt: int,
    owner: str,
    checkpoint_id: str,
    step: int,
    data: bytes,
    messages: Sequence[tuple[int, bytes]],
    usage: StepUsage | None,
    records: Sequence[StepRecord],
    prune_before: int | None,
    flushed: bool = True,
) -> int:
    """Store the step's whole durable record in one commit (see the module); the CRC.

    Raises:
        AttemptFenced: a later attempt or another process owns the job, or it has ended; nothing was written.
    """
    crc = crc32(data)
    spent = usage or StepUsage()
    params: dict[str, Any] = {}
    if messages:
        params.update(seqs=[seq for seq, _ in messages], messages=[message for _, message in messages])
    if records:
        params.update(record_params(records, attempt))
    shape = (bool(messages), bool(records), prune_before is not None, bool(spent), flushed)
    written = await tx.execute(
        tx.sql.checkpoint(shape),
        job_id=job_id,
        attempt=attempt,
        owner=owner,
        checkpoint_id=checkpoint_id,
        step=step,
        data=data,
        crc=crc,
        input_tokens=spent.input_tokens,
        output_tokens=spent.output_tokens,
        cost_usd=spent.cost_usd,
        kept_from=prune_before,
        **params,
    )
    if not written:
        raise AttemptFenced(f"job {job_id}: write by attempt {attempt} refused, a later attempt owns the row")
    return crc


async def load_conversation(tx: Tx, job_id: str, length: int) -> list[bytes]:
    """The first ``length`` stored conversation messages of the job, in order."""
    rows = await tx.fetch(tx.sql.load_messages, job_id=job_id, length=length)
    return [as_bytes(row[0]) for row in rows]
