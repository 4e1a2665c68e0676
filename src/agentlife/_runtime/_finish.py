"""How a job ends: delivery, the terminal status, housekeeping, memories, crash records.

`Finisher` ends one job over `Booted`: delivery happens at most once per channel (inside the step runner's
scope, so the drain bounds it); failures the runtime decides (budgets) and crashes are recorded on the job
row. `record_crash` needs no booted job: a crash during boot has no row to write.
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
from agentlife._config import Settings
from agentlife._exceptions import ApprovalRejected, describe_error
from agentlife._exitcode import ExitCode
from agentlife._redact import Redactor
from agentlife._replay import utf8_safe
from agentlife._runtime._base import TERMINAL_STATUSES, Outcome
from agentlife._runtime._drain import Drain
from agentlife._runtime._events import JobEvents
from agentlife._runtime._process import ProcessShell
from agentlife._runtime._services import JobServices
from agentlife._runtime._steps import StepRunner
from agentlife._state import State, StateMachine
from agentlife.constants import Constants
from agentlife.stores import JobStatus
from agentlife.stores._delivery import DeliveryGuard, run_housekeeping
from agentlife.stores._jobs import HELD

if TYPE_CHECKING:
    from agentlife.stores import JobStore

log = logging.getLogger("agentlife.runtime")


class Finisher:
    """Delivery, terminal statuses and memories of one booted job."""

    def __init__(self, runner: StepRunner, services: JobServices) -> None:
        self.runner, self.services = runner, services
        self.booted, self.agent, self.host = runner.booted, runner.agent, runner.host
        self.constants, self.redactor = runner.constants, runner.host.redactor

    async def deliver_and_finish(self, job: Job, doc: CheckpointDoc) -> Outcome:
        """Delivery first (at most once per channel), then the terminal status, then housekeeping."""
        booted = self.booted
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
        with self.runner.scope() as scope:
            delivered = await guard.deliver(lambda: self.agent.deliver(doc.result))
            log.info("delivered" if delivered else "delivery already recorded: not delivered again")
        if scope.cancelled_caught:
            return Outcome(
                ExitCode.DRAINED, "drain deadline reached during delivery; the next attempt delivers"
            )
        await store.set_status(
            s.job_id,
            s.attempt,
            status,
            result=_row_result(doc.result, doc.reason),
            error=_failure_record(doc.reason, s.attempt) if status == "FAILED" else None,
            expect=HELD,
        )
        if not self.host.draining:
            await run_housekeeping([lambda: self.agent.housekeeping(doc.result)])  # logs its own errors
            await self._store_memories(job, doc)
        enter_draining(self.host.events.machine, f"job {status.lower()}")
        return Outcome(ExitCode.DONE, f"job {status}", status)

    async def failed_by_runtime(self, reason: str) -> Outcome:
        """The runtime failed the job (a budget ran out): FAILED on the row."""
        s = self.booted.settings
        await self.booted.store.set_status(
            s.job_id,
            s.attempt,
            JobStatus.FAILED,
            result={"reason": reason},
            error=_failure_record(reason, s.attempt, "BudgetExhausted"),
            expect=HELD,
        )
        enter_draining(self.host.events.machine, "job failed")
        return Outcome(ExitCode.DONE, reason, JobStatus.FAILED)

    def rejected(self, rejection: ApprovalRejected) -> Outcome:
        """A restricted call was refused: the job is over, FAILED as the row already says; nothing written.

        The refusal is known only from a terminal status (``job reject``, or the job ended while the call
        waited), so the row needs no write from here, and no delivery or housekeeping runs for it.
        """
        log.warning("job failed: %s", rejection)
        enter_draining(self.host.events.machine, "job rejected")
        return Outcome(ExitCode.DONE, f"job FAILED: {rejection}", JobStatus.FAILED)

    async def _store_memories(self, job: Job, doc: CheckpointDoc) -> None:
        """Write the agent's memories of this job back, best effort, within the memory budget."""
        try:
            texts = self.agent.memories_to_store(doc.result, doc.state)
            if texts:
                with anyio.fail_after(self.constants.hydration.memory_timeout_seconds):
                    memory = await self.services.open_memory(self.booted.settings)
                    await memory.add(texts, {"job_id": job.id})
        except Exception as exc:
            log.warning("memory write-back failed: %s", self.redactor.redact(str(exc)))


async def cleanup(
    outcome: Outcome,
    services: JobServices,
    events: JobEvents,
    drain: Drain,
    constants: Constants,
    shell: ProcessShell | None,
) -> None:
    """Flush and close the job's services inside the cleanup budget, shielded from cancellation.

    ``shell``: the process is this job's own, so its hard exit keeps the settled exit code from now.
    """
    budget = constants.drain.cleanup_budget_seconds
    if shell is not None and not drain.draining:
        shell.arm_hard_exit(budget, outcome.exit_code)  # the work is settled: keep its exit code
    with anyio.move_on_after(budget, shield=True) as scope:
        await services.close_resources(constants)
    if scope.cancelled_caught:
        log.error("cleanup exceeded its %gs budget; exiting anyway", budget)
    if drain.started is not None:
        events.telemetry.drain(drain.reason or outcome.reason, time.monotonic() - drain.started)
    if events.state is not State.TERMINATED:
        events.machine.move(State.TERMINATED, outcome.reason)
    await services.end_session(outcome.exit_code, outcome.reason, constants)


def enter_draining(machine: StateMachine, reason: str) -> None:
    """Move to DRAINING after the job ended, unless a signal already did (SIGTERM during delivery)."""
    if machine.state is not State.DRAINING:
        machine.move(State.DRAINING, reason)


async def record_crash(
    exc: BaseException,
    *,
    state: State,
    step: int | None,
    settings: Settings | None,
    store: JobStore | None,
    job: Job | None,
    constants: Constants,
    redactor: Redactor,
) -> Outcome:
    """Log the crash and put its record on the job row (when there is one to write); exit 1."""

    def crash_text(text: str) -> str:
        # Redacted, and storable: a lone surrogate in an exception's message becomes its escape.
        return utf8_safe(redactor.redact(text))

    message = crash_text(f"{type(exc).__name__}: {exc}")
    log.error("crash in step %s: %s", step, message, exc_info=exc)
    from agentlife.stores._policy import CrashRecord

    # The shape `should_retry_after_crash` reads back, plus what a person needs to debug it.
    record = CrashRecord.from_exception(
        exc,
        attempt=settings.attempt if settings else 0,
        exit_code=ExitCode.CRASH,
        step=step,
        redact=crash_text,
    ).to_dict()
    record["state"] = state.value
    record["traceback"] = crash_text("".join(traceback.format_exception(exc)))[-4000:]
    if store is not None and settings is not None and job is not None:
        with anyio.move_on_after(constants.drain.cleanup_budget_seconds / 2, shield=True):
            try:
                # The row's status as it is now, not as hydration saw it: a control plane that failed
                # the job meanwhile (say, refusing a parked approval) must not be overruled by the crash.
                row = await store.get_job(settings.job_id)
                status = row.status if row is not None else job.status
                if status in TERMINAL_STATUSES:  # ended by someone else: never rewritten, not even here
                    log.warning("crash not recorded on the job row: it is already %s", status)
                else:
                    await store.set_status(
                        settings.job_id,
                        settings.attempt,
                        status if status != JobStatus.PENDING else JobStatus.RUNNING,
                        error=record,
                        expect=(status,),
                    )
            except Exception as store_exc:  # a driver error too: the crash stays a crash (exit 1), logged
                why = describe_error(store_exc, redact=redactor.redact)
                log.error("could not record the crash on the job row: %s", why)
    return Outcome(ExitCode.CRASH, f"crash: {message.splitlines()[0][:300]}")


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
