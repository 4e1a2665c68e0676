"""Durable waits on the job row: a job parked at ``ctx.sleep`` is WAITING, with what it waits for.

`CheckpointStore.park_waiting` hands a RUNNING job held by an attempt back as WAITING, in one conditional
write: ``not_before`` is when the wait ends (the claim takes the row once it has passed, like a RETRYING
one) and the ``waiting`` column (JSON) says what it waits for, for ``job show``. `CheckpointStore.get_wait`
reads them back. Nothing else of the job's waits lives on the row: the wait itself, and its outcome, are in
the journal.

Parking locks the row first and then looks at what the wait waits for: an event already sent, or children
that have all ended, make the row runnable at once, so a send or a child's end that came while the job
parked is never left without a wake-up (see `_events` and `_childjobs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from agentlife.stores._base import JobStatus
from agentlife.stores._pause import settle_pause, woken_at_once
from agentlife.stores._rows import dumps

if TYPE_CHECKING:
    from agentlife.stores._dialect import Tx

__all__ = ["WaitState", "get_wait", "park_waiting"]


@dataclass(frozen=True, slots=True)
class WaitState:
    """A job row's status and, while it is WAITING, what it waits for."""

    status: str
    """The row's status (a `JobStatus` value)."""
    until: float | None = None
    """Unix time the wait ends (the row's ``not_before``), or None when the row is not WAITING."""
    waiting_for: dict[str, Any] = field(default_factory=dict)
    """What the job waits for (``kind``, ``until``, ``invocation_id``), or an empty dict."""

    @classmethod
    def of(cls, status: str, until: float | None, raw: Any) -> WaitState:
        """From the row's columns; a ``waiting`` column that is not a JSON object reads as empty."""
        if status != JobStatus.WAITING:
            return cls(status)
        try:
            value = orjson.loads(raw) if isinstance(raw, str | bytes) else raw
        except orjson.JSONDecodeError:
            value = None
        return cls(status, until, value if isinstance(value, dict) else {})


async def park_waiting(tx: Tx, job_id: str, attempt: int, until: float, waiting_for: dict[str, Any]) -> bool:
    """RUNNING (held by ``attempt``) -> WAITING until ``until``; False when the row was not that.

    A wait already over when it parks (a drain during a short wait's last moment) wakes a listening worker.
    """
    async with tx.atomic():
        # The row lock first, then a fresh look at the events: a send that held the lock has committed.
        await tx.execute(tx.sql.lock_job, job_id=job_id)
        at_once = await woken_at_once(tx, job_id, waiting_for)
        parked = await tx.execute(
            tx.sql.park,
            job_id=job_id,
            attempt=attempt,
            until=until,
            at_once=at_once,
            waiting=dumps(waiting_for),
        )
        if parked == 1:  # an operator's pause requested meanwhile: PAUSED, the wait kept for the resume
            await settle_pause(tx, job_id)
    return parked == 1


async def get_wait(tx: Tx, job_id: str) -> WaitState | None:
    """The row's status and what it waits for, or None when there is no such job."""
    found = await tx.fetchrow(tx.sql.get_wait, job_id=job_id)
    return None if found is None else WaitState.of(found["status"], found["until"], found["waiting"])
