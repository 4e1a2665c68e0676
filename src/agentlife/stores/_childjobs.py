"""Child jobs on the job table: who started a row, and the parent's wake-up when its last child ends.

Three columns of the job row: ``parent_id`` (the job that started it), ``spawned_by`` (the invocation id of
the starting call) and ``detached`` (not cancelled with the parent). `CheckpointStore.start_child` inserts
the row if absent, keyed on its id, in one write fenced by the parent's attempt: a start re-run after a
crash finds its own row (same parent, same call) and creates nothing; a row of any other origin is a
`ChildJobError`.

A parent parked at ``ctx.wait_for_jobs`` is WAITING with ``{"jobs": [ids]}`` in its ``waiting`` column.
Every write that ends a child (finish, cancel, reject, the reaper's verdict, a worker setting a row aside,
an operator's or a control plane's own UPDATE) wakes the parent in the same statement, through a trigger on
the job table: when the child's status becomes terminal and every job the parent waits for has ended, the
parent's ``not_before`` becomes now (and on PostgreSQL a ``NOTIFY`` wakes an idle worker of its agent). The
trigger locks the parent row before it looks at the siblings, so two children ending at once cannot both
miss the last one. Parking (`CheckpointStore.park_waiting`) locks the row too and looks at the children
itself, so a child that ended while the parent parked is not left without a wake-up.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from agentlife._exceptions import AttemptFenced, ChildJobError, JobNotFound, JobStateConflict
from agentlife._jobrefs import JobOutcome
from agentlife.stores._base import JobRecord, JobStatus
from agentlife.stores._jobs import TERMINAL
from agentlife.stores._limits import check_key_columns
from agentlife.stores._prune import pruned_job, pruned_message

if TYPE_CHECKING:
    from agentlife.stores._dialect import Tx
    from agentlife.stores._roles import OperatorStore

__all__ = [
    "MAX_CANCEL_TREE",
    "JobFamily",
    "cancel_with_children",
    "child_outcomes",
    "children_ended",
    "get_family",
    "job_ids_waited_for",
    "start_child",
]

#: The most jobs one ``job cancel`` walks through (a parent, its children, theirs ...).
MAX_CANCEL_TREE = 10_000


@dataclass(frozen=True, slots=True)
class JobFamily:
    """Where a job stands among child jobs: its parent, and the children it started."""

    parent_id: str | None = None
    """The job that started this one, or None."""
    spawned_by: str | None = None
    """The invocation id of the parent's call that started it."""
    detached: bool = False
    """Started detached: not cancelled with its parent."""
    children: list[tuple[str, str, bool]] = field(default_factory=list)
    """The jobs it started: (id, status, detached), in id order."""


def job_ids_waited_for(waiting_for: Any) -> list[str]:
    """The job ids a ``waiting`` column (decoded) names under ``jobs``; [] for anything else."""
    jobs = waiting_for.get("jobs") if isinstance(waiting_for, dict) else None
    return [j for j in jobs if isinstance(j, str)] if isinstance(jobs, list) else []


def _outcome(
    job_id: str,
    status: str,
    result: Any,
    error: Any,
    *,
    ended_at: float | None = None,
    ended_by: float | None = None,
) -> JobOutcome:
    """A child's outcome from its row's columns (JSON text or decoded); what does not decode is left out.

    A child that ended after ``ended_by`` (its row last written then: a terminal row is never rewritten)
    stood unfinished at that time; which status it had then is not kept, so it reads ``RUNNING``.
    """
    if status in TERMINAL and ended_by is not None and not _ended_by(ended_at, ended_by):
        return JobOutcome(job_id=job_id, status=str(JobStatus.RUNNING))
    result, history = _decoded(result), _decoded(error)
    return JobOutcome(
        job_id=job_id,
        status=str(status),
        result=result if status in TERMINAL else None,
        error=None if status == JobStatus.COMPLETED or status not in TERMINAL else _last_error(history),
    )


def _ended_by(ended_at: Any, deadline: float) -> bool:
    """Whether a row written at ``ended_at`` (unix time; anything else from another client) ended by then."""
    if isinstance(ended_at, bool) or not isinstance(ended_at, int | float) or math.isnan(ended_at):
        return True  # no usable time: the end is taken as it is rather than held back for ever
    return ended_at <= deadline


def _decoded(value: Any) -> Any:
    if isinstance(value, memoryview):
        value = bytes(value)
    if isinstance(value, str | bytes):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    return value


def _last_error(history: Any) -> str | None:
    if not isinstance(history, list):
        return None
    for entry in reversed(history):
        if isinstance(entry, dict) and entry.get("message") is not None:
            kind = entry.get("error_class")
            text = " ".join(str(entry["message"]).split())[:500]
            return f"{kind}: {text}" if isinstance(kind, str) and kind else text
    return None


def _check_parentage(parent_id: str, wanted: Sequence[str], found: dict[str, str | None]) -> None:
    for job_id in wanted:
        if job_id not in found:
            raise ChildJobError(f"ctx.wait_for_jobs: job {job_id} does not exist")
        if found[job_id] != parent_id:
            raise ChildJobError(f"ctx.wait_for_jobs: job {job_id} is not a child of job {parent_id}")


def _check_existing(job_id: str, agent_id: str, parent_id: str, invocation_id: str, row: Any) -> None:
    """`ChildJobError` unless the existing row ``(agent, parent, spawned_by)`` is the child of this call."""
    agent, parent, spawned_by = row
    if parent != parent_id or spawned_by != invocation_id:
        raise ChildJobError(
            f"ctx.start_job: job {job_id} already exists and was not started by this call ({invocation_id})"
        )
    if agent != agent_id:
        raise ChildJobError(f"ctx.start_job: job {job_id} exists for agent {agent}, not {agent_id}")


async def start_child(
    tx: Tx,
    parent_id: str,
    attempt: int,
    owner: str,
    job_id: str,
    agent_id: str,
    payload: Any,
    invocation_id: str,
    detached: bool,
    concurrency_key: str | None = None,
    priority: int = 0,
) -> bool:
    """Create the child's PENDING row unless it exists; True when this call created it.

    One statement inserts the row only if the parent is held by ``attempt`` and ``owner``, and only if no
    row has the id (and wakes the child agent's idle workers when it inserted); otherwise the existing row
    says whether it is this call's child.

    Raises:
        ChildJobError: a job ``job_id`` exists that another job or call created, or of another agent.
        AttemptFenced: the parent row is not held by ``attempt`` and ``owner``.
    """
    check_key_columns(tx, concurrency_key, priority)
    created = await tx.execute(
        tx.sql.start_child,
        job_id=job_id,
        agent_id=agent_id,
        payload=orjson.dumps(payload).decode(),
        parent_id=parent_id,
        invocation_id=invocation_id,
        detached=detached,
        attempt=attempt,
        owner=owner,
        concurrency_key=concurrency_key,
        priority=priority,
        incarnation=uuid.uuid4().hex,
    )
    if created:
        return True
    existing = await tx.fetchrow(tx.sql.origin, job_id=job_id)
    if existing is None:
        tomb = await pruned_job(tx, job_id)
        if tomb is not None:  # never run again: a child that ran and was pruned keeps its id taken
            raise ChildJobError(f"ctx.start_job: {pruned_message(job_id, tomb)}: its id cannot be used again")
        raise AttemptFenced(f"job {parent_id}: child start by attempt {attempt} refused")
    _check_existing(job_id, agent_id, parent_id, invocation_id, (existing[0], existing[1], existing[2]))
    return False


async def child_outcomes(
    tx: Tx, parent_id: str, job_ids: Sequence[str], ended_by: float | None
) -> list[JobOutcome]:
    """Each child's status, result and error, in the order of ``job_ids``.

    Raises:
        ChildJobError: one of them does not exist or is not a child of ``parent_id``.
    """
    rows = await tx.fetch(tx.sql.child_rows, job_ids=sorted(set(job_ids)))
    _check_parentage(parent_id, job_ids, {r["id"]: r["parent_id"] for r in rows})
    by_id = {
        r["id"]: _outcome(
            r["id"], r["status"], r["result"], r["error"], ended_at=r["ended_at"], ended_by=ended_by
        )
        for r in rows
    }
    return [by_id[i] for i in job_ids]


async def get_family(tx: Tx, job_id: str) -> JobFamily | None:
    """The job's parent and the children it started; None when there is no such job."""
    found = await tx.fetchrow(tx.sql.family, job_id=job_id)
    if found is None:
        return None
    children = await tx.fetch(tx.sql.children, job_id=job_id)
    return JobFamily(found[0], found[1], bool(found[2]), [(c[0], c[1], bool(c[2])) for c in children])


async def children_ended(tx: Tx, job_ids: Sequence[str]) -> bool:
    """Whether every job of ``job_ids`` has ended (inside the caller's transaction)."""
    ids = sorted(set(job_ids))
    if not ids:
        return False
    return int(await tx.fetchval(tx.sql.children_ended, job_ids=ids)) == len(ids)


# -- cancel ----------------------------------------------------------------------------------------------


async def cancel_with_children(
    store: OperatorStore, job_id: str, reason: str, *, actor: str | None = None
) -> tuple[JobRecord, list[JobRecord]]:
    """Cancel ``job_id`` (`OperatorStore.cancel`), then its children that are not detached, recursively.

    The job first: a parent cancelled is fenced out and starts nothing more, and its children's ends wake
    nobody. A child that has ended, or ends meanwhile, is left as it is. Returns the job's row and the rows
    of the children cancelled. ``actor`` is recorded in every cancel.

    Raises:
        JobNotFound, JobStateConflict: the job itself cannot be cancelled; nothing changed.
    """
    row = await store.cancel(job_id, reason, actor=actor)
    cancelled: list[JobRecord] = []
    seen, queue = {job_id}, [job_id]
    while queue and len(seen) <= MAX_CANCEL_TREE:
        family = await store.get_family(queue.pop(0))
        for child, status, detached in family.children if family is not None else ():
            if detached or child in seen:  # a hand-made cycle of parents stops here
                continue
            seen.add(child)
            queue.append(child)
            if status in TERMINAL:
                continue
            with contextlib.suppress(JobStateConflict, JobNotFound):  # ended or gone meanwhile
                reason_child = f"{reason} (parent {job_id} cancelled)"
                cancelled.append(await store.cancel(child, reason_child, actor=actor))
    return row, cancelled
