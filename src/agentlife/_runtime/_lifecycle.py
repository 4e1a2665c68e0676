"""The lifecycle of one agent process: boot, hydrate, execute, drain, exit.

`Runtime.run()` is the whole process in one structured-concurrency scope:

* BOOTING: probe server thread first, background imports, settings, session journal, store.
* HYDRATING: claim + checkpoint (mandatory), journal scan (5 s), memory fetch (10 s), in that order.
* READY → EXECUTING: the step loop, checkpointing after every completed step.
* DRAINING: on SIGTERM/SIGINT the current step gets ``STEP_DEADLINE`` to finish, then cleanup runs
  shielded inside ``CLEANUP_BUDGET``; after job completion the same path closes everything.
* TERMINATED, with the process's exit code (0, 1 or 143).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread

from agentlife._agent import Job
from agentlife._budget import Budget
from agentlife._checkpoint import CheckpointDoc
from agentlife._config import Settings
from agentlife._exceptions import (
    AttemptFenced,
    BootFailure,
    BudgetExhausted,
    ConfigError,
    ParkRequested,
    StoreUnavailable,
)
from agentlife._logging import job_attributes, log_fields
from agentlife._preload import Preloader
from agentlife._retry import classify
from agentlife._runtime._base import (
    EXIT_CRASH,
    EXIT_DONE,
    EXIT_DRAINED,
    EXIT_USAGE,
    PHASE_NAMES,
    TERMINAL_STATUSES,
    Hydrated,
    Outcome,
    Resume,
    RunOptions,
)
from agentlife._runtime._finish import FinishMixin
from agentlife._runtime._hydration import Hydrator
from agentlife._runtime._mcp_tools import MCPTools
from agentlife._runtime._signals import EarlySignal, receive_drain_signals
from agentlife._state import State
from agentlife._step._approvals import Approvals
from agentlife._step._host import Booted, RuntimeStats
from agentlife.stores import store_from_url

if TYPE_CHECKING:
    from agentlife.stores import CheckpointStore

__all__ = [
    "EXIT_CRASH",
    "EXIT_DONE",
    "EXIT_DRAINED",
    "EXIT_USAGE",
    "EarlySignal",
    "RunOptions",
    "Runtime",
    "RuntimeStats",
]

log = logging.getLogger("agentlife.runtime")


class Runtime(FinishMixin):
    """Runs one `AgentProcess` through its lifecycle and returns the process exit code."""

    def request_drain(self, reason: str) -> None:
        """Begin the drain (what SIGTERM does). A second request is logged and ignored."""
        if self.draining:
            log.warning("%s received during drain: ignored until cleanup is over", reason)
            return
        if self.state is State.TERMINATED:
            return
        self._draining = True
        self.drain_reason = reason
        if self.drain_event is not None:
            self.drain_event.set()
        self._drain_started = time.monotonic()
        self.drain_deadline = anyio.current_time() + self.constants.drain.step_deadline_seconds
        log.info("drain requested by %s", reason, extra=log_fields(reason=reason))
        self._arm_hard_exit(
            self.constants.drain.step_deadline_seconds + self.constants.drain.cleanup_budget_seconds,
            EXIT_DRAINED,
        )
        if self.journal is not None:
            self.journal.append("DRAIN_STARTED", reason=reason)
        state = self._drained_in = self.state
        if self._step_scope is not None:
            self._drained_in_step = self._current_step
        if state in (State.BOOTING, State.HYDRATING, State.READY, State.EXECUTING):
            self.machine.move(State.DRAINING, reason)
        if state in (State.BOOTING, State.HYDRATING) and self._phase_scope is not None:
            self._phase_scope.cancel()
        if self._step_scope is not None:
            self._step_scope.deadline = min(self._step_scope.deadline, self.drain_deadline)

    async def run(self) -> int:
        """Run the lifecycle to TERMINATED and return the exit code."""
        self.drain_event = anyio.Event()
        if self.draining:
            self.drain_event.set()
        with self._logging(), contextlib.ExitStack() as self._job_scope:
            try:
                async with anyio.create_task_group() as services:
                    if self.options.handle_signals:
                        await services.start(self._receive_signals)
                    outcome = await self._lifecycle(services)
                    services.cancel_scope.cancel()
            except BaseException:
                self.hard_exit.disarm()
                raise
            self.hard_exit.settle(self.constants.drain.cleanup_budget_seconds, outcome.exit_code)
            self.exit_code, self.exit_reason = outcome.exit_code, outcome.reason
            self._log_exit(outcome)
            return outcome.exit_code

    def _log_exit(self, outcome: Outcome) -> None:
        """The process's last line: its exit code and why."""
        log.info(
            "exit %s: %s",
            outcome.exit_code,
            outcome.reason,
            extra=log_fields(exit_code=outcome.exit_code, reason=outcome.reason),
        )

    async def _lifecycle(self, services: anyio.abc.TaskGroup) -> Outcome:
        hydrated: Hydrated | None = None
        outcome: Outcome
        try:
            with anyio.CancelScope() as self._phase_scope:
                if self.draining:  # a signal caught during imports (EarlySignal) arrived before this scope
                    self._phase_scope.cancel()
                booted = await self._boot(services)
                self.machine.move(State.HYDRATING, "stores open")
                hydrated = await self._hydrate(booted, services)
            self._phase_scope = None
            if hydrated is None or self.draining:
                outcome = Outcome(
                    EXIT_DRAINED,
                    f"drained during {PHASE_NAMES.get(self._drained_in, self._drained_in.value.lower())}",
                )
            elif isinstance(hydrated.resume.doc.status, str) and hydrated.resume.doc.phase == "done":
                outcome = Outcome(EXIT_DONE, f"job already {hydrated.resume.doc.status}")
            else:
                outcome = await self._execute(booted, hydrated)
        except BootFailure as exc:
            # The one ERROR line saying why the pod died (the transition and exit lines are INFO).
            log.error("fatal: %s", exc)
            outcome = Outcome(EXIT_CRASH, str(exc))
        except AttemptFenced as exc:
            log.error("stopping: %s", exc)
            outcome = Outcome(EXIT_CRASH, str(exc))
        except Exception as exc:
            outcome = await self._crashed(exc)
        await self._cleanup(outcome)
        return outcome

    async def _boot(self, services: anyio.abc.TaskGroup) -> Booted:
        self._start_probe_server()
        self.notify("booting")
        try:
            settings = Settings.from_env(
                self.env,
                job_id=self.options.job_id,
                agent_id=self.agent.agent_id or None,
                constants=self.options.constants,
            )
        except ConfigError as exc:
            raise BootFailure(f"configuration error: {exc}") from None
        self.settings, self.constants = settings, settings.constants
        # Every span and measurement of this job names it, in a worker too (whose resource names no job).
        self._job_scope.enter_context(job_attributes(settings.job_id, settings.attempt))
        logging.getLogger().setLevel(settings.log_level)
        self.board.update(
            job_id=settings.job_id,
            agent_id=settings.agent_id,
            attempt=settings.attempt,
            pod_name=settings.pod_name,
            blocked_threshold_seconds=settings.constants.probe.blocked_threshold_seconds,
        )
        self._preloader = Preloader(self._modules_to_preload(settings)).start()
        journal = self.journal = self._open_journal(settings)
        self._start_services(services, settings, journal)
        store = self.store = await self._open_store(settings)
        return Booted(settings, store, journal)

    async def _open_store(self, settings: Settings) -> CheckpointStore:
        """This process's store connection (a worker lends its own to each job instead)."""
        store = store_from_url(settings.resolved_database_url)
        try:
            await store.open()  # bounded by the store's own connect timeout and tries
        except StoreUnavailable as exc:
            raise BootFailure(f"store unreachable: {self.redactor.redact(str(exc))}") from None
        self.board.store_has_free_connection = store.has_free_connection
        return store

    async def _hydrate(self, booted: Booted, services: anyio.abc.TaskGroup) -> Hydrated:
        hydrator = Hydrator(booted, redactor=self.redactor, telemetry=self.telemetry)
        self.notify("hydration_started")
        job_row = await hydrator.claim_job(create=self.options.create_job, payload=self.options.payload)
        self._start_job_heartbeat(services, booted)
        job = self.job = Job(
            job_row.id, job_row.agent_id, booted.settings.attempt, job_row.payload, job_row.status
        )
        approvals = self.approvals = Approvals(booted, job, self, lambda: self._current_step)
        budget = self.budget = Budget.build(
            self.constants.budget, job_row.token_budget, job_row.tokens_consumed
        )
        if job_row.status in TERMINAL_STATUSES:
            log.info("job %s is already %s: nothing to do", job_row.id, job_row.status)
            done = Resume(CheckpointDoc(status=job_row.status, phase="done"), job_row.checkpoint_id)
            return Hydrated(job, budget, approvals, done)
        doc, checkpoint_id = await hydrator.load_checkpoint()
        self.checkpoint_id = checkpoint_id
        conversation = await hydrator.load_conversation(doc)
        replay = await hydrator.scan_journal(checkpoint_id, doc)
        approvals.restore(doc)
        memories = await hydrator.fetch_memories(
            doc, job=job, agent=self.agent, open_memory=lambda: self.open_memory(booted.settings)
        )
        self.mcp_tools = MCPTools.for_agent(self.agent)
        if self.mcp_tools is not None:  # the optional MCP step: this job's servers, started and listed
            await self.mcp_tools.hydrate(
                booted, services, replay, redactor=self.redactor, telemetry=self.telemetry
            )
        resume = Resume(doc, checkpoint_id, replay, memories, conversation)
        hydrated = Hydrated(job, budget, approvals, resume)
        if self._drain_pending():
            # The signal came while a memory call ran on a worker thread (no cancel reaches it) and its error
            # was handled, so the phase scope's cancel had no await to land on: drained, never READY.
            return hydrated
        self.machine.move(State.READY, "hydrated")
        # Built after READY: its ~120 ms of SDK imports would otherwise compete with boot for the GIL.
        # Everything recorded before then is buffered by the facade and replayed.
        self.telemetry.start_building(booted.settings, self.board, dict(self.env))
        self.notify("ready")
        return hydrated

    async def _execute(self, booted: Booted, hydrated: Hydrated) -> Outcome:
        if self.draining:
            return Outcome(EXIT_DRAINED, "drained before execution")
        self.machine.move(State.EXECUTING, "step loop")
        llm = self._llm_client = self.agent.make_llm()
        doc, replay = hydrated.resume.doc, hydrated.resume.replay
        while doc.phase != "delivering":
            if self._drain_pending():  # a call, not the property: a signal may have come during the step
                return Outcome(EXIT_DRAINED, self._drained_between_steps())
            try:
                result, doc = await self._run_step(booted, hydrated, llm, doc, replay)
            except ParkRequested:
                return await self._park(booted, doc)
            except Exception as exc:
                if hydrated.approvals.rejection is not None:  # whatever the step raised after a refusal
                    return self._finish_rejected(hydrated.approvals.rejection)
                if isinstance(exc, BudgetExhausted):
                    log.error(str(exc))
                    return await self._finish_failed_by_runtime(booted, doc, str(exc))
                if not (self._drain_pending() and self._fenced is None and classify(exc).retryable):
                    raise
                # The drain left no time to retry a transient error: the step is as resumable as one cancelled
                # at the deadline (its completed calls are journaled). A crash record here would count a
                # drain against the job's crash policy (same error 3x -> dead letter).
                log.warning(
                    "step %s failed during the drain with %s: %s; not retried now, the "
                    "next attempt resumes the step",
                    doc.next_step,
                    type(exc).__name__,
                    self.redactor.redact(str(exc)),
                )
                return Outcome(EXIT_DRAINED, f"step {doc.next_step} failed transiently during the drain")
            replay = None
            if self._fenced is not None:
                raise self._fenced
            if result is None:
                return Outcome(EXIT_DRAINED, f"step {doc.next_step} cancelled at the drain deadline")
        return await self._deliver_and_finish(booted, hydrated.job, doc)

    def _receive_signals(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> Any:
        drain = self.constants.drain
        drain_budget = drain.step_deadline_seconds + drain.cleanup_budget_seconds
        return receive_drain_signals(
            self.request_drain,
            early=self.options.early_signal,
            on_signal_off_loop=lambda: self._arm_hard_exit(drain_budget, EXIT_DRAINED),
            task_status=task_status,
        )
