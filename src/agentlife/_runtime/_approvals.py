"""Approvals for ``restricted=True`` tools: park in WAITING_FOR_APPROVAL, poll, give up at the idle timeout.

How a job is approved: the control plane moves the row's status from ``WAITING_FOR_APPROVAL`` back to
``RUNNING`` (or ``PENDING``); any other status (``FAILED``, ``DEAD_LETTER`` ...) refuses the call. A job
whose payload holds ``"approved": true`` is approved from the start. Once seen, approval is kept in the
checkpoint, so later attempts do not ask again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from agentlife._exceptions import BackgroundOperationRestricted, ParkRequested
from agentlife.stores import JobStatus

if TYPE_CHECKING:
    from agentlife._checkpoint import CheckpointDoc
    from agentlife._runtime._lifecycle import Runtime

__all__ = ["Approvals"]

log = logging.getLogger("agentlife.approvals")
_APPROVED = (JobStatus.RUNNING, JobStatus.PENDING, JobStatus.RETRYING)


class Approvals:
    """The job's approval state and the parking loop."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.approved = False

    def restore(self, doc: CheckpointDoc, row_status: str) -> None:
        """Approval as hydration finds it: in the checkpoint, in the payload, or granted while parked."""
        job = self.runtime.job
        payload = job.payload if job is not None else None
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
        rt = self.runtime
        assert rt.store is not None and rt.settings is not None and rt.journal is not None
        s, budget = rt.settings, rt.constants.budget
        await rt.store.set_status(s.job_id, s.attempt, JobStatus.WAITING_FOR_APPROVAL)
        rt.journal.append("APPROVAL_REQUESTED", tool=tool_name, step=rt.board.snapshot().step)
        log.info(
            "%s needs approval: job parked in WAITING_FOR_APPROVAL (polling every %gs, idle timeout %gs)",
            tool_name,
            budget.approval_poll_seconds,
            budget.idle_timeout_seconds,
        )
        deadline = anyio.current_time() + budget.idle_timeout_seconds
        while True:
            if rt.draining:
                raise ParkRequested
            row = await rt.store.get_job(s.job_id)
            status = row.status if row is not None else JobStatus.FAILED
            if status in _APPROVED:
                self.approved = True
                if status != JobStatus.RUNNING:
                    await rt.store.set_status(s.job_id, s.attempt, JobStatus.RUNNING)
                log.info("%s approved", tool_name)
                return
            if status != JobStatus.WAITING_FOR_APPROVAL:
                raise BackgroundOperationRestricted(
                    f"{tool_name} refused: the job was not approved (status {status})"
                )
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                raise ParkRequested
            assert rt.drain_event is not None
            with anyio.move_on_after(min(budget.approval_poll_seconds, remaining)):
                await rt.drain_event.wait()
