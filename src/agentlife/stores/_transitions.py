"""What an operator does to a job row: approve, reject, cancel, retry (the rules are in `_jobs`).

Each locks the row, checks that its status allows the operation (`check_transition`: `JobNotFound` or
`JobStateConflict` otherwise), and rewrites it in the same transaction: of two operations racing on a
row, the second waits for the first and judges the status it left. The crash-history entry each one
records is appended under the same lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentlife.stores._approval import (
    check_request,
    granted,
    loads_approval,
    rejected,
    rejection_record,
    retried,
)
from agentlife.stores._base import CLAIM_STALE_AFTER_SECONDS, JobRecord, JobStatus, owner_is_live
from agentlife.stores._jobs import (
    APPROVABLE,
    CANCELLABLE,
    RETRYABLE,
    check_transition,
    operator_record,
    retry_marker,
)
from agentlife.stores._prune import not_found
from agentlife.stores._rows import appended, dumps

if TYPE_CHECKING:
    from agentlife.stores._dialect import Row, Statement, Tx

__all__ = ["approve", "cancel", "reject", "retry"]


async def approve(
    tx: Tx,
    job_id: str,
    invocation_id: str | None,
    digest: str | None,
    no_call: bool = False,
    actor: str | None = None,
) -> JobRecord:
    """Grant the call the row is parked on: RUNNING for a live parked process, else PENDING.

    A PENDING row wakes the agent's idle workers. ``actor`` is recorded in the grant (``approved_by``).
    """
    async with tx.atomic():
        _, locked = await _locked(tx, job_id, "approve", APPROVABLE)
        approval = loads_approval(locked["approval"])
        check_request(job_id, approval, invocation_id, digest, no_call=no_call)
        live = owner_is_live(locked["owner"], locked["heartbeat_age"], CLAIM_STALE_AFTER_SECONDS)
        column, _ = granted(approval, tx.now, actor)
        status = JobStatus.RUNNING if live else JobStatus.PENDING
        return await _changed(tx, tx.sql.approve, job_id, status=str(status), approval=dumps(column))


async def reject(tx: Tx, job_id: str, reason: str, actor: str | None = None) -> JobRecord:
    """WAITING_FOR_APPROVAL -> FAILED, final, the reason and the refused call recorded."""
    async with tx.atomic():
        row, locked = await _locked(tx, job_id, "reject", APPROVABLE)
        column, request = rejected(loads_approval(locked["approval"]), reason, tx.now, actor)
        entry = operator_record("ApprovalRejected", reason, row.attempt, tx.now, actor=actor)
        entry = rejection_record(entry, request)
        return await _changed(tx, tx.sql.reject, job_id, approval=dumps(column), **appended(row, entry))


async def cancel(tx: Tx, job_id: str, reason: str, actor: str | None = None) -> JobRecord:
    """PENDING, RETRYING, RUNNING, WAITING_FOR_APPROVAL or WAITING -> FAILED with ``attempt + 1``.

    The bumped attempt fences out a process still running the job (and its claim token is dropped).
    """
    async with tx.atomic():
        row, _ = await _locked(tx, job_id, "cancel", CANCELLABLE)
        entry = operator_record("Cancelled", reason, row.attempt, tx.now, actor=actor)
        return await _changed(tx, tx.sql.cancel, job_id, **appended(row, entry))


async def retry(tx: Tx, job_id: str, actor: str | None = None) -> JobRecord:
    """FAILED or DEAD_LETTER -> PENDING, runnable now (waking the agent's idle workers); approves nothing.

    The owner stays: a reaped row's tombstone must go on fencing out the process it was taken from.
    """
    async with tx.atomic():
        row, locked = await _locked(tx, job_id, "retry", RETRYABLE)
        column = retried(loads_approval(locked["approval"]))
        entry = retry_marker(row.attempt, tx.now, actor=actor)
        return await _changed(tx, tx.sql.retry, job_id, approval=dumps(column), **appended(row, entry))


async def _locked(tx: Tx, job_id: str, operation: str, allowed: Sequence[str]) -> tuple[JobRecord, Row]:
    """Lock the row and check that its status allows ``operation``: (the row, its locked columns)."""
    locked = await tx.fetchrow(tx.sql.lock_row, job_id=job_id)
    if locked is None:
        raise await not_found(tx, job_id)
    row = check_transition(job_id, operation, tx.job(locked), allowed)
    return row, locked


async def _changed(tx: Tx, statement: Statement, job_id: str, **params: Any) -> JobRecord:
    """Run the operation's update of the locked row; the row as it left it."""
    row = await tx.fetchrow(statement, job_id=job_id, **params)
    assert row is not None
    return tx.job(row)
