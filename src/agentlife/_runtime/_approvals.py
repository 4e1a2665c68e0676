"""Approvals for ``restricted=True`` tools: park in WAITING_FOR_APPROVAL, poll, give up at the idle timeout.

How a job is approved: the control plane moves the row's status from ``WAITING_FOR_APPROVAL`` back to
``RUNNING`` (or ``PENDING``); any other status (``FAILED``, ``DEAD_LETTER`` ...) refuses the call. A job
whose payload holds ``"approved": true`` is approved from the start. Once seen, approval is kept in the
checkpoint, so later attempts do not ask again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from agentlife._exceptions import BackgroundOperationRestricted, ParkRequested
from agentlife.stores import JobStatus

if TYPE_CHECKING:
    from agentlife._agent import Job
    from agentlife._checkpoint import CheckpointDoc
    from agentlife._runtime._host import Booted, DrainState

__all__ = ["Approvals"]

log = logging.getLogger("agentlife.approvals")
_APPROVED = (JobStatus.RUNNING, JobStatus.PENDING, JobStatus.RETRYING)


class Approvals:
    """The job's approval state and the parking loop.

    Args:
        booted: the job's settings, store and journal.
        job: the job, as hydration found it (its payload may carry ``"approved": true``).
        drain: stops the wait when a drain begins.
        current_step: the step in progress, for the journal.
    """

    def __init__(
        self, booted: Booted, job: Job, drain: DrainState, current_step: Callable[[], int | None]
    ) -> None:
        self.booted = booted
        self.job = job
        self.drain = drain
        self.current_step = current_step
        self.approved = False

    def restore(self, doc: CheckpointDoc, row_status: str) -> None:
        """Approval as hydration finds it: in the checkpoint, in the payload, or granted while parked."""
        payload = self.job.payload
        self.approved = (
            doc.approved
            or (isinstance(payload, dict) and payload.get("approved") is True)
            or (doc.phase == "awaiting_approval" and row_status in _APPROVED)
        )
        if doc.phase == "awaiting_approval":
            log.info(
                "resuming a parked job: %s", "approved" if self.approved else "still waiting for approval"
            )

    async def require_approval(self, tool_name: str) -> None:
        """Return once the job is approved; raise `ParkRequested` at the idle timeout or on drain.

        Raises:
            BackgroundOperationRestricted: the control plane refused approval.
        """
        if self.approved:
            return
        s, store = self.booted.settings, self.booted.store
        budget = s.constants.budget
        await store.set_status(s.job_id, s.attempt, JobStatus.WAITING_FOR_APPROVAL)
        self.booted.journal.append("APPROVAL_REQUESTED", tool=tool_name, step=self.current_step())
        log.info(
            "%s needs approval: job parked in WAITING_FOR_APPROVAL (polling every %gs, idle timeout %gs)",
            tool_name,
            budget.approval_poll_seconds,
            budget.idle_timeout_seconds,
        )
        deadline = anyio.current_time() + budget.idle_timeout_seconds
        while True:
            if self.drain.draining:
                raise ParkRequested
            row = await store.get_job(s.job_id)
            status = row.status if row is not None else JobStatus.FAILED
            if status in _APPROVED:
                self.approved = True
                if status != JobStatus.RUNNING:
                    await store.set_status(s.job_id, s.attempt, JobStatus.RUNNING)
                log.info("%s approved", tool_name)
                return
            if status != JobStatus.WAITING_FOR_APPROVAL:
                raise BackgroundOperationRestricted(
                    f"{tool_name} refused: the job was not approved (status {status})"
                )
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                raise ParkRequested
            await self._wait(min(budget.approval_poll_seconds, remaining))

    async def _wait(self, seconds: float) -> None:
        """Until the next poll, or the drain, whichever comes first."""
        event = self.drain.drain_event
        with anyio.move_on_after(seconds):
            if event is None:
                await anyio.sleep(seconds)
            else:
                await event.wait()
