"""The zombie reaper: RUNNING rows whose heartbeat stopped go back to the queue (the rules are in `_jobs`).

`reap` finds the candidates (RUNNING rows whose heartbeat is older than the threshold, and with
``dead_owners`` those claimed by a process of this pid namespace that has exited), then acts on each in a
transaction of its own: it locks the row only if it is still a candidate (on PostgreSQL ``SKIP LOCKED``, so
two reapers never both act on it), decides with `decide_reap` from the row's crash history and the agent's
recent crashes, and writes the decision conditional on the row still being RUNNING with the same attempt.
Heartbeats carry the database's clock, so the reaper judges them by it, not by this host's. A row that
carries an operator's pause request is PAUSED instead of RETRYING (the crash recorded, the retry's backoff
kept for the resume); a decision to end the job (DEAD_LETTER, FAILED) stands.
"""

from __future__ import annotations

import dataclasses
import socket
from typing import TYPE_CHECKING

from agentlife.constants import Constants
from agentlife.stores._base import REAPED_OWNER, JobStatus, owner_is_gone
from agentlife.stores._jobs import ReapDecision, crash_count, decide_reap
from agentlife.stores._pause import settle_pause
from agentlife.stores._rows import appended, as_text, decode_histories

if TYPE_CHECKING:
    from agentlife.stores._dialect import Database, Tx

__all__ = ["reap"]

#: A candidate: the row's id, and the claim token of its exited owner (None: its heartbeat is stale).
_Candidate = tuple[str, str | None]


async def reap(
    db: Database, threshold_seconds: float, now: float | None, constants: Constants | None, dead_owners: bool
) -> list[ReapDecision]:
    """Act on every candidate, each in its own transaction; the decisions made (see the module)."""
    constants = constants or Constants()
    at, candidates = await db.run(_candidates, threshold_seconds, now, constants, dead_owners)
    decisions = []
    for job_id, gone in candidates:
        decision = await db.run(_reap_one, job_id, gone, at, threshold_seconds, constants)
        if decision is not None:
            decisions.append(decision)
    return decisions


async def _candidates(
    tx: Tx, threshold: float, now: float | None, constants: Constants, dead_owners: bool
) -> tuple[float, list[_Candidate]]:
    """The time the reaper judges by (``now``, or the database's clock), and the rows to look at.

    A row whose id or owner is not UTF-8 text (written by another client) is left out: the next claim sets
    it aside, and it must not stop the reaper meanwhile.
    """
    at = float(await tx.fetchval(tx.sql.clock)) if now is None else now
    found: list[_Candidate] = []
    for row in await tx.fetch(tx.sql.stale, cutoff=at - threshold):
        job_id = as_text(row[0])
        if job_id is not None:
            found.append((job_id, None))
    if dead_owners:
        stale = {job_id for job_id, _ in found}
        # A fresh heartbeat always wins over the dead-owner check: the owner must have missed a beat too.
        fresh = at - constants.heartbeat.job_interval_seconds
        for row in await tx.fetch(tx.sql.owned_here, host=f"{socket.gethostname()}:%", cutoff=fresh):
            job_id, owner = as_text(row[0]), as_text(row[1])
            if job_id is not None and owner is not None and job_id not in stale and owner_is_gone(owner):
                found.append((job_id, owner))
    return at, found


async def _reap_one(
    tx: Tx, job_id: str, gone: str | None, at: float, threshold: float, constants: Constants
) -> ReapDecision | None:
    """Decide on one candidate and write the decision; None when it is no longer one."""
    window = constants.budget.circuit_window_seconds
    async with tx.atomic():
        if gone is None:
            locked = await tx.fetchrow(tx.sql.lock_stale, job_id=job_id, cutoff=at - threshold)
        else:
            fresh = at - constants.heartbeat.job_interval_seconds
            locked = await tx.fetchrow(tx.sql.lock_owned, job_id=job_id, owner=gone, cutoff=fresh)
        if locked is None:
            return None  # another reaper holds it or got there first, or a heartbeat came in
        row = tx.job(locked)
        seen = row.heartbeat_at if row.heartbeat_at is not None else row.updated_at
        histories = await tx.fetch(tx.sql.agent_errors, agent_id=row.agent_id, since=at - window)
        crashes = crash_count(decode_histories(h[0] for h in histories), at - window)
        decision, entry = decide_reap(
            row,
            now=at,
            heartbeat_age=at - (seen or 0.0),
            threshold=threshold,
            agent_crashes=crashes,
            constants=constants,
            owner_gone=gone is not None,
        )
        done = await tx.execute(
            tx.sql.reap,
            job_id=job_id,
            attempt=row.attempt,
            status=decision.status,
            not_before=decision.not_before,
            at=at,
            owner=REAPED_OWNER,
            **appended(row, entry),
        )
        if done and await settle_pause(tx, job_id):  # a pause requested of the dead process: PAUSED
            decision = dataclasses.replace(decision, status=str(JobStatus.PAUSED))
    return decision if done else None
