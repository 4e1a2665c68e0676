"""An operator's pause and resume of a job (``job pause`` / ``job resume``); the rules are in `_jobs`.

The row's ``paused`` column (JSON) says what a pause keeps:

- a PAUSED row: ``{"from": status, "reason", "actor", "at"}``, the status it was paused in, which
  ``resume`` puts back. Its ``not_before``, ``waiting``, ``approval`` and kept events stay as they were:
  a wait's timer that ends while paused, or an event sent meanwhile, takes effect on resume.
- a RUNNING row: ``{"requested": true, "reason", "actor", "at"}``. The process holding it reads the request
  (`pause_requested`) at its next step boundary and hands the row back; a process that parks at a wait or an
  approval, or a row the reaper takes from a dead process, settles it the same way (`settle_pause`, in the
  transaction of that write): the row becomes PAUSED in the status it was handed back in. A job never runs
  and is paused at once, and a pause is never lost: until the hand-back it is RUNNING with the request.

Each operation locks the row and checks its status under the lock, as `_transitions` does: of two operators
racing on one row, the second judges what the first left (`JobStateConflict`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from agentlife._exceptions import JobStateConflict, StoreUnavailable
from agentlife.stores._base import JobRecord, JobStatus
from agentlife.stores._childjobs import children_ended, job_ids_waited_for
from agentlife.stores._jobs import PAUSABLE, RUNNABLE, check_transition, operator_record
from agentlife.stores._prune import not_found
from agentlife.stores._rows import appended, dumps

if TYPE_CHECKING:
    from agentlife.stores._dialect import Tx

__all__ = ["pause", "pause_info", "pause_requested", "resume", "settle_pause", "woken_at_once"]


async def pause(tx: Tx, job_id: str, reason: str, actor: str) -> JobRecord:
    """PENDING, RETRYING, WAITING or WAITING_FOR_APPROVAL -> PAUSED; RUNNING: the request on the row.

    Raises:
        JobNotFound, JobStateConflict: no such job; it has ended, is PAUSED, or its pause is requested.
    """
    _check_table(tx)
    async with tx.atomic():
        locked = await tx.fetchrow(tx.sql.lock_row, job_id=job_id)
        if locked is None:
            raise await not_found(tx, job_id)
        row = check_transition(job_id, "pause", tx.job(locked), PAUSABLE)
        if pause_info(locked["pause"]).get("requested") is True:
            raise JobStateConflict(
                f"cannot pause job {job_id}: its pause is already requested"
                " (it stops at its next step boundary)"
            )
        info: dict[str, Any] = {"reason": reason, "actor": actor, "at": tx.now}
        if row.status == JobStatus.RUNNING:
            info["requested"] = True
            status, what = JobStatus.RUNNING, "PauseRequested"
        else:
            info["from"] = str(row.status)
            status, what = JobStatus.PAUSED, "Paused"
        entry = operator_record(what, reason, row.attempt, tx.now, actor=actor)
        entry["paused_from"] = str(row.status)
        changed = await tx.fetchrow(
            tx.sql.pause, job_id=job_id, status=str(status), paused=dumps(info), **appended(row, entry)
        )
    assert changed is not None
    return tx.job(changed)


async def resume(tx: Tx, job_id: str, actor: str) -> JobRecord:
    """PAUSED -> the status it was paused in; a RUNNING row's pending request is withdrawn.

    A WAITING row whose awaited event came while it was paused, or whose timer ended, is runnable at once.

    Raises:
        JobNotFound, JobStateConflict: no such job, or it is neither PAUSED nor RUNNING with a request.
    """
    _check_table(tx)
    async with tx.atomic():
        locked = await tx.fetchrow(tx.sql.lock_row, job_id=job_id)
        allowed = (JobStatus.PAUSED, JobStatus.RUNNING)
        if locked is None:
            raise await not_found(tx, job_id)
        row = check_transition(job_id, "resume", tx.job(locked), allowed)
        info = pause_info(locked["pause"])
        if row.status == JobStatus.RUNNING:
            if info.get("requested") is not True:
                raise JobStateConflict(f"cannot resume job {job_id}: it is RUNNING and not paused")
            status, wake = JobStatus.RUNNING, False
        else:
            status = _paused_from(info)
            wake = status == JobStatus.WAITING and await _woken_while_paused(tx, job_id)
        entry = operator_record("Resumed", f"resumed as {status}", row.attempt, tx.now, actor=actor)
        changed = await tx.fetchrow(
            tx.sql.resume, job_id=job_id, status=str(status), wake=wake, **appended(row, entry)
        )
    assert changed is not None
    return tx.job(changed)


async def settle_pause(tx: Tx, job_id: str) -> bool:
    """A requested pause takes effect on the row just handed back (inside that write's transaction)."""
    return bool(await tx.execute(tx.sql.settle_pause, job_id=job_id))


async def pause_requested(tx: Tx, job_id: str, attempt: int) -> bool:
    """Whether the RUNNING row held by ``attempt`` carries an operator's pause request."""
    return bool(await tx.fetchval(tx.sql.pause_requested, job_id=job_id, attempt=attempt))


def pause_info(raw: Any) -> dict[str, Any]:
    """The ``paused`` column as a dict (empty when NULL or not a JSON object)."""
    if isinstance(raw, bytes | str):
        try:
            raw = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {}
    return raw if isinstance(raw, dict) else {}


def _paused_from(info: dict[str, Any]) -> JobStatus:
    """The status a PAUSED row goes back to: the one kept, else PENDING (a row paused by another client)."""
    kept = info.get("from")
    try:
        status = JobStatus(kept) if isinstance(kept, str) else JobStatus.PENDING
    except ValueError:
        return JobStatus.PENDING
    settles = (*RUNNABLE, JobStatus.WAITING_FOR_APPROVAL)
    return status if status in settles else JobStatus.PENDING


async def _woken_while_paused(tx: Tx, job_id: str) -> bool:
    """Whether an event the wait takes was sent, or a child it waits for ended, while the job was paused."""
    found = await tx.fetchrow(tx.sql.lock_wait, job_id=job_id)
    return found is not None and await woken_at_once(tx, job_id, pause_info(found["waiting"]))


def _check_table(tx: Tx) -> None:
    if not tx.sql.keys:
        raise StoreUnavailable("the job table cannot hold a pause yet: run `python -m agentlife db init`")


async def woken_at_once(tx: Tx, job_id: str, waiting_for: dict[str, Any]) -> bool:
    """Whether the wait is over already: an event it takes was sent, or the children it waits for ended."""
    names, jobs = _event_names(waiting_for), job_ids_waited_for(waiting_for)
    at_once = bool(names) and await tx.fetchval(tx.sql.event_sent, job_id=job_id, names=names) is not None
    if not at_once and jobs:
        at_once = await children_ended(tx, jobs)
    return at_once


def _event_names(waiting_for: dict[str, Any]) -> list[str]:
    events = waiting_for.get("events")
    return [n for n in events if isinstance(n, str)] if isinstance(events, list) else []
