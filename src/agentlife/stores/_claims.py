"""Job rows and claims: read and create rows, claim one job or the next runnable one, and the fenced writes.

A process claims a job by writing its attempt and its claim token (``owner``, `new_owner`) to the row.
Every write after that is fenced by both: a write that matches no row (a later attempt, or another
process, holds the job) raises `AttemptFenced` and changes nothing. A same-attempt claim is refused while
another live process holds the row (`claim_refusal`); a worker's claim (`claim_next`) takes the oldest
runnable row and bumps its attempt, so concurrent claimers never get the same row (PostgreSQL locks it
``FOR UPDATE SKIP LOCKED``, SQLite takes the write lock).

Each function is one operation of the store, run by its database (`Database.run`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from agentlife._exceptions import AttemptFenced, JobStateConflict
from agentlife.stores._base import JobRecord, JobStatus, add_usage_totals, claim_refusal
from agentlife.stores._dialect import SlotTaken
from agentlife.stores._jobs import SET_ASIDE_PER_CLAIM, check_releasable, expected_statuses
from agentlife.stores._limits import ClaimLimits, check_key_columns
from agentlife.stores._pause import settle_pause
from agentlife.stores._prune import not_found, pruned_text
from agentlife.stores._rows import appended, as_text, dumps, set_aside_entry

if TYPE_CHECKING:
    from agentlife.stores._dialect import Tx

#: How many times one `claim_next` claims again after losing a running slot to a concurrent claim: each
#: loss means another claim of the same key or agent committed, so the next try sees it.
SLOT_RETRIES = 8

__all__ = [
    "SLOT_RETRIES",
    "Claimed",
    "add_usage",
    "claim",
    "claim_next",
    "count_runnable",
    "create_job",
    "drop_claim",
    "get_job",
    "heartbeat",
    "list_jobs",
    "release",
    "release_claims",
    "set_status",
]


@dataclass(frozen=True, slots=True)
class Claimed:
    """What one `claim_next` did: the row it claimed, the rows it set aside, the next due time it learnt."""

    row: JobRecord | None = None
    set_aside: list[JobRecord] = field(default_factory=list)
    next_due: float | None = None
    """Seconds until the agent's next row not yet due comes due (None: there is none), when `due_known`."""
    due_known: bool = False
    """Nothing was claimed and the database said when the agent's next row comes due (PostgreSQL's claim of
    one agent's job answers it in the same statement)."""


async def get_job(tx: Tx, job_id: str) -> JobRecord | None:
    """The job row, or None."""
    row = await tx.fetchrow(tx.sql.get_job, job_id=job_id)
    return None if row is None else tx.job(row)


async def create_job(
    tx: Tx,
    job_id: str,
    agent_id: str,
    payload: Any,
    token_budget: dict[str, Any] | None,
    exclusive: bool,
    concurrency_key: str | None = None,
    priority: int = 0,
) -> JobRecord:
    """Insert a PENDING row unless one exists (an insert wakes the agent's idle workers); the row.

    ``exclusive``: a row that exists is a `JobStateConflict`, decided by the insert itself, so of creators
    racing for one id exactly one is told it created the job.
    """
    check_key_columns(tx, concurrency_key, priority)
    inserted = await tx.execute(
        tx.sql.create_job,
        job_id=job_id,
        agent_id=agent_id,
        status=str(JobStatus.PENDING),
        payload=dumps(payload),
        token_budget=dumps(token_budget),
        concurrency_key=concurrency_key,
        priority=priority,
        incarnation=uuid.uuid4().hex,
    )
    row = await tx.fetchrow(tx.sql.get_job, job_id=job_id)
    if row is None:  # the insert found a tombstone
        raise JobStateConflict(await pruned_text(tx, job_id))
    job = tx.job(row)
    if exclusive and not inserted:
        raise JobStateConflict(f"job {job_id} already exists ({job.status}, agent {job.agent_id})")
    return job


async def claim(tx: Tx, job_id: str, attempt: int, owner: str) -> JobRecord:
    """Take the row for ``attempt`` and the claim token ``owner``, unless `claim_refusal` says no."""
    # The row lock serialises concurrent claims: the second sees the first one's token and loses.
    async with tx.atomic():
        current = await tx.fetchrow(tx.sql.lock_claim, job_id=job_id)
        if current is None:
            raise await not_found(tx, job_id)
        age = current["heartbeat_age"]
        refusal = claim_refusal(job_id, attempt, current["attempt"], current["owner"], owner, age)
        if refusal is not None:
            raise AttemptFenced(refusal)
        row = await tx.fetchrow(tx.sql.take_claim, job_id=job_id, attempt=attempt, owner=owner)
    assert row is not None
    return tx.job(row)


async def claim_next(tx: Tx, agent_id: str | None, owner: str, limits: ClaimLimits | None = None) -> Claimed:
    """Claim the first runnable row (of ``agent_id``, or of any agent), setting aside those it cannot read.

    The first: the highest priority, then the row due first (a new row is due at its creation), then the id.
    With ``limits``, the claim statement itself skips rows whose concurrency key, or agent, has as many
    RUNNING rows as its limit; a claim that lost a running slot to a concurrent one (`SlotTaken`, PostgreSQL)
    is run again, up to `SLOT_RETRIES` times, then this call claims nothing (the worker claims again later).
    Each claim is one statement, atomic by itself; a row that cannot be read is set aside (DEAD_LETTER, the
    reason in its crash history) by a second, fenced by this claim: should the process die between the two,
    the row is RUNNING under a dead owner and the reaper gives it back, to be set aside by the next claim.
    At most `SET_ASIDE_PER_CLAIM` rows are set aside per call.
    """
    limited = limits is not None and limits.active
    if limited:
        assert limits is not None
        keys = limits.key_default is not None or bool(limits.key_limits)
        statement = tx.sql.claim_limited(agent_id is not None, keys, limits.agent is not None)
        params: dict[str, Any] = {
            "key_limits": limits.key_limits_json(),
            "key_default": limits.key_default,
            "agent_limit": limits.agent,
        }
    else:
        statement = tx.sql.claim_any if agent_id is None else tx.sql.claim_agent
        params = {}
    set_aside: list[JobRecord] = []
    lost = 0
    for _ in range(SET_ASIDE_PER_CLAIM + SLOT_RETRIES):
        try:
            row = await tx.fetchrow(statement, owner=owner, agent_id=agent_id, **params)
        except SlotTaken:
            lost += 1
            if lost >= SLOT_RETRIES:
                return Claimed(None, set_aside)
            continue
        if row is None:
            return Claimed(None, set_aside)
        if row["key"] is None:
            return Claimed(None, set_aside, row["next_due"], due_known=True)
        claimed = tx.job(row)
        if not claimed.unreadable:
            return Claimed(claimed, set_aside)
        entry = set_aside_entry(claimed, tx.now)
        await tx.execute(
            tx.sql.set_aside, key=row["key"], attempt=claimed.attempt, owner=owner, **appended(claimed, entry)
        )
        set_aside.append(claimed)
        if len(set_aside) >= SET_ASIDE_PER_CLAIM:
            break
    return Claimed(None, set_aside)


async def list_jobs(
    tx: Tx,
    status: str | None,
    agent_id: str | None,
    limit: int,
    after: tuple[Any, str | bytes | None] | None,
    concurrency_key: str | None = None,
) -> list[JobRecord]:
    """Rows, most recently updated first (ties by id), filtered, after the cursor ``after``.

    Raises:
        ValueError: ``after`` is not a cursor of this database.
    """
    filtered = (status is not None, agent_id is not None)
    statement, cursor = tx.sql.page(*filtered, after, concurrency_key is not None)
    rows = await tx.fetch(
        statement, status=status, agent_id=agent_id, limit=limit, key=concurrency_key, **cursor
    )
    return [tx.job(row) for row in rows]


async def count_runnable(tx: Tx) -> dict[str, int]:
    """How many rows are runnable now, per agent id (an id that is not UTF-8 shown with U+FFFD)."""
    counts: dict[str, int] = {}
    for row in await tx.fetch(tx.sql.count_runnable):
        agent = as_text(row[0], errors="replace")
        if agent is not None:
            counts[agent] = int(row[1])
    return counts


async def set_status(
    tx: Tx,
    job_id: str,
    attempt: int,
    owner: str,
    status: str,
    result: Any,
    error: dict[str, Any] | None,
    expect: Sequence[str] | None,
) -> None:
    """Write the status (and result, or append the crash record ``error``) if the row is held as expected."""
    held = {"job_id": job_id, "attempt": attempt, "owner": owner}
    changed = await tx.execute(
        tx.sql.set_status,
        **held,
        status=str(status),
        result=dumps(result),
        entry=dumps(error),
        allowed=list(expected_statuses(expect)),
    )
    if changed:
        return
    found = await tx.fetchval(tx.sql.fenced_status, **held)
    if found is not None:
        raise AttemptFenced(f"job {job_id}: {status} by attempt {attempt} refused: the row is {found}")
    raise AttemptFenced(f"job {job_id}: status write by attempt {attempt} refused")


async def add_usage(
    tx: Tx, job_id: str, attempt: int, owner: str, input_tokens: int, output_tokens: int, cost_usd: float
) -> dict[str, Any]:
    """Add to ``tokens_consumed`` of the held row; the new totals."""
    async with tx.atomic():
        row = await tx.fetchrow(tx.sql.lock_usage, job_id=job_id, attempt=attempt, owner=owner)
        if row is None:
            raise AttemptFenced(f"job {job_id}: usage write by attempt {attempt} refused")
        stored = None if row[0] is None else orjson.loads(row[0])
        totals = add_usage_totals(stored or {}, input_tokens, output_tokens, cost_usd)
        await tx.execute(tx.sql.write_usage, job_id=job_id, totals=dumps(totals))
    return totals


async def heartbeat(tx: Tx, job_id: str, attempt: int, owner: str) -> None:
    """Set ``heartbeat_at`` of the held row to the database's now."""
    if not await tx.execute(tx.sql.heartbeat, job_id=job_id, attempt=attempt, owner=owner):
        raise AttemptFenced(
            f"job {job_id}: heartbeat by attempt {attempt} refused, a later attempt owns the row"
        )


async def release(tx: Tx, job_id: str, attempt: int, status: str, delay_seconds: float) -> bool:
    """Hand back the RUNNING row held by ``attempt`` as ``status``; False when it has moved on.

    A row handed back PENDING or RETRYING with an operator's pause request on it becomes PAUSED.

    Raises:
        ValueError: ``status`` is not one a job may be released in.
    """
    state = check_releasable(status)
    async with tx.atomic():
        released = await tx.execute(
            tx.sql.release, job_id=job_id, attempt=attempt, status=state, delay=float(delay_seconds)
        )
        if released == 1:  # an operator's pause requested meanwhile takes effect on the row handed back
            await settle_pause(tx, job_id)
    return released == 1


async def drop_claim(tx: Tx, job_id: str, owner: str) -> None:
    """Clear the row's claim token if it is still ``owner``."""
    await tx.execute(tx.sql.drop_claim, job_id=job_id, owner=owner)


async def release_claims(tx: Tx, job_ids: Sequence[str], owner: str) -> None:
    """Clear the claim token ``owner`` from the rows ``job_ids`` (a store closing)."""
    await tx.execute(tx.sql.release_claims, job_ids=list(job_ids), owner=owner)
