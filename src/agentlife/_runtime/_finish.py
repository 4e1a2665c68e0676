"""How a job ends: delivery, the terminal status, housekeeping, memories, crash records.

Delivery happens at most once per channel; failures the runtime decides (budgets) and crashes are
recorded on the job row.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread

from agentlife._agent import Job
from agentlife._checkpoint import CheckpointDoc
from agentlife._exceptions import AgentlifeError, ApprovalRejected
from agentlife._replay import utf8_safe
from agentlife._runtime._base import EXIT_CRASH, EXIT_DONE, EXIT_DRAINED, TERMINAL_STATUSES, Outcome
from agentlife._step._host import Booted
from agentlife.stores import JobStatus
from agentlife.stores._delivery import DeliveryGuard, run_housekeeping
from agentlife.stores._jobs import HELD

if TYPE_CHECKING:
    pass

from agentlife._runtime._steps import StepsMixin

log = logging.getLogger("agentlife.runtime")


class FinishMixin(StepsMixin):
    """Delivery, terminal statuses and crash records."""

    async def _deliver_and_finish(self, booted: Booted, job: Job, doc: CheckpointDoc) -> Outcome:
        """Delivery first (at most once per channel), then the terminal status, then housekeeping."""
        s, store, status = booted.settings, booted.store, doc.status or JobStatus.COMPLETED
        retry = self.constants.retry
        guard = DeliveryGuard(
            store,
            s.job_id,
            self.agent.delivery_channel,
            attempts=retry.delivery_attempts,
            initial=retry.delivery_initial_seconds,
            multiplier=retry.delivery_multiplier,
        )
        with anyio.CancelScope() as scope:
            self._step_scope = scope
            if self.drain_deadline is not None:
                scope.deadline = self.drain_deadline
            delivered = await guard.deliver(lambda: self.agent.deliver(doc.result))
            log.info("delivered" if delivered else "delivery already recorded: not delivered again")
        self._step_scope = None
        if scope.cancelled_caught:
            return Outcome(EXIT_DRAINED, "drain deadline reached during delivery; the next attempt delivers")
        await store.set_status(
            s.job_id,
            s.attempt,
            status,
            result=_row_result(doc.result, doc.reason),
            error=_failure_record(doc.reason, s.attempt) if status == "FAILED" else None,
            expect=HELD,
        )
        if not self.draining:
            await run_housekeeping([lambda: self.agent.housekeeping(doc.result)])  # logs its own errors
            await self._store_memories(booted, job, doc)
        self._enter_draining(f"job {status.lower()}")
        return Outcome(EXIT_DONE, f"job {status}", status)

    async def _finish_failed_by_runtime(self, booted: Booted, doc: CheckpointDoc, reason: str) -> Outcome:
        s = booted.settings
        await booted.store.set_status(
            s.job_id,
            s.attempt,
            JobStatus.FAILED,
            result={"reason": reason},
            error=_failure_record(reason, s.attempt, "BudgetExhausted"),
            expect=HELD,
        )
        self._enter_draining("job failed")
        return Outcome(EXIT_DONE, reason, JobStatus.FAILED)

    def _finish_rejected(self, rejection: ApprovalRejected) -> Outcome:
        """A restricted call was refused: the job is over, FAILED as the row already says; nothing written.

        The refusal is known only from a terminal status (``job reject``, or the job ended while the call
        waited), so the row needs no write from here, and no delivery or housekeeping runs for it.
        """
        log.warning("job failed: %s", rejection)
        self._enter_draining("job rejected")
        return Outcome(EXIT_DONE, f"job FAILED: {rejection}", JobStatus.FAILED)

    async def _store_memories(self, booted: Booted, job: Job, doc: CheckpointDoc) -> None:
        """Write the agent's memories of this job back, best effort, within the memory budget."""
        try:
            texts = self.agent.memories_to_store(doc.result, doc.state)
            if texts:
                with anyio.fail_after(self.constants.hydration.memory_timeout_seconds):
                    memory = await self.open_memory(booted.settings)
                    await memory.add(texts, {"job_id": job.id})
        except Exception as exc:
            log.warning("memory write-back failed: %s", self.redactor.redact(str(exc)))

    def _crash_text(self, text: str) -> str:
        """Redacted, and storable: a lone surrogate in an exception's message becomes its escape."""
        return utf8_safe(self.redactor.redact(text))

    async def _crashed(self, exc: BaseException) -> Outcome:
        message = self._crash_text(f"{type(exc).__name__}: {exc}")
        log.error("crash in step %s: %s", self._current_step, message, exc_info=exc)
        from agentlife.stores._policy import CrashRecord

        # The shape `should_retry_after_crash` reads back, plus what a person needs to debug it.
        record = CrashRecord.from_exception(
            exc,
            attempt=self.settings.attempt if self.settings else 0,
            exit_code=EXIT_CRASH,
            step=self._current_step,
            redact=self._crash_text,
        ).to_dict()
        record["state"] = self.state.value
        record["traceback"] = self._crash_text("".join(traceback.format_exception(exc)))[-4000:]
        if self.store is not None and self.settings is not None and self.job is not None:
            with anyio.move_on_after(self.constants.drain.cleanup_budget_seconds / 2, shield=True):
                try:
                    # The row's status as it is now, not as hydration saw it: a control plane that failed
                    # the job meanwhile (say, refusing a parked approval) must not be overruled by the crash.
                    row = await self.store.get_job(self.settings.job_id)
                    status = row.status if row is not None else self.job.status
                    if status in TERMINAL_STATUSES:  # ended by someone else: never rewritten, not even here
                        log.warning("crash not recorded on the job row: it is already %s", status)
                    else:
                        await self.store.set_status(
                            self.settings.job_id,
                            self.settings.attempt,
                            status if status != JobStatus.PENDING else JobStatus.RUNNING,
                            error=record,
                            expect=(status,),
                        )
                except AgentlifeError as store_exc:
                    log.error(
                        "could not record the crash on the job row: %s", self.redactor.redact(str(store_exc))
                    )
        return Outcome(EXIT_CRASH, f"crash: {message.splitlines()[0][:300]}")


def _row_result(result: Any, reason: str | None) -> Any:
    if result is None and reason:
        return {"reason": reason}
    return result


def _failure_record(reason: str | None, attempt: int, error_class: str = "JobFailed") -> dict[str, Any]:
    return {
        "at": time.time(),
        "attempt": attempt,
        "exit_code": 0,
        "error_class": error_class,
        "message": reason or "job failed",
    }
