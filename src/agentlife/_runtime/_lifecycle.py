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

import logging
import os
import random
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc
import anyio.to_thread
import orjson

from agentlife._agent import AgentProcess, Done, Footprint, Job
from agentlife._budget import Budget
from agentlife._checkpoint import CheckpointDoc
from agentlife._config import Settings
from agentlife._exceptions import (
    AgentlifeError,
    AttemptFenced,
    BootFailure,
    BudgetExhausted,
    ConfigError,
    ParkRequested,
    StoreUnavailable,
)
from agentlife._journal import Journal, contained_session_dir
from agentlife._lag import run_lag_monitor
from agentlife._logging import installed_json_logging, log_fields
from agentlife._preload import Preloader
from agentlife._redact import Redactor
from agentlife._replay import check_replayable
from agentlife._runtime._approvals import Approvals
from agentlife._runtime._context import CallEnv, StepContext
from agentlife._runtime._host import Booted, RuntimeStats
from agentlife._runtime._hydration import Hydrator
from agentlife._runtime._signals import EarlySignal, HardExit, receive_drain_signals
from agentlife._state import State, StateMachine, Transition
from agentlife._status import StatusBoard
from agentlife._telemetry_facade import TelemetryFacade
from agentlife.constants import Constants
from agentlife.stores import JobStatus, store_from_url

if TYPE_CHECKING:
    from agentlife._journal import ReplayMap
    from agentlife._llm import LLMClient, LLMReply
    from agentlife._memory import MemoryRecord, QdrantMemory
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

EXIT_DONE = 0
EXIT_CRASH = 1
EXIT_USAGE = 2
EXIT_DRAINED = 143

log = logging.getLogger("agentlife.runtime")
_PHASE_NAMES = {
    State.BOOTING: "boot",
    State.HYDRATING: "hydration",
    State.READY: "the wait for the first step",
}
_TERMINAL_STATUSES = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.DEAD_LETTER)
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How this process runs; the CLI and the test harness differ only here.

    Attributes:
        job_id: overrides ``AGENTLIFE_JOB_ID``.
        payload: the job payload for a job row this process creates.
        create_job: create a missing job row on PostgreSQL too (SQLite always creates it).
        handle_signals: install the SIGTERM/SIGINT receiver (main thread only).
        json_logs: route logging through the JSON handler on stdout.
        hard_exit: after the drain budget, ``os._exit`` even if code ignoring cancellation still runs.
        probes: start the probe server.
        constants: use these instead of reading them from the environment.
        log_stream: where JSON logs go (default stdout).
        early_signal: a signal caught before the runtime started (see `EarlySignal`).
    """

    job_id: str | None = None
    payload: Any = None
    create_job: bool = False
    handle_signals: bool = True
    json_logs: bool = True
    hard_exit: bool = True
    probes: bool = True
    constants: Constants | None = None
    log_stream: Any = None
    early_signal: EarlySignal | None = None


@dataclass(slots=True)
class _Outcome:
    exit_code: int
    reason: str
    status: str | None = None


@dataclass(slots=True)
class _Resume:
    doc: CheckpointDoc
    checkpoint_id: str | None
    replay: ReplayMap | None = None
    memories: list[MemoryRecord] = field(default_factory=list)


Observer = Callable[[str, dict[str, Any]], None]


class Runtime:
    """Runs one `AgentProcess` through its lifecycle and returns the process exit code."""

    def __init__(
        self,
        agent: AgentProcess,
        *,
        env: Mapping[str, str] | None = None,
        options: RunOptions | None = None,
    ) -> None:
        self.agent = agent
        self.env: Mapping[str, str] = dict(os.environ if env is None else env)
        self.options = options or RunOptions()
        self.redactor = Redactor.from_env(self.env)
        self.machine = StateMachine(on_listener_error=self._listener_failed)
        self.stats = RuntimeStats()
        self.telemetry = TelemetryFacade()
        self.constants: Constants = self.options.constants or Constants()
        self.settings: Settings | None = None
        self.board = StatusBoard(job_id="", agent_id=agent.agent_id, attempt=0)
        self.journal: Journal | None = None
        self.store: CheckpointStore | None = None
        self.memory: QdrantMemory | None = None
        self.approvals: Approvals | None = None
        self.budget: Budget | None = None
        self.job: Job | None = None
        self._draining = False
        self.drain_event: anyio.Event | None = None
        self.drain_reason: str | None = None
        self.drain_deadline: float | None = None
        self.observers: list[Observer] = []
        self.exit_code: int | None = None
        self.checkpoint_id: str | None = None
        self._llm_client: LLMClient | None = None
        self._drain_started: float | None = None
        self._phase_scope: anyio.CancelScope | None = None
        self._step_scope: anyio.CancelScope | None = None
        self._services: anyio.abc.TaskGroup | None = None
        self._preloader: Preloader | None = None
        self._probe_server: Any = None
        self._heartbeat: Any = None
        self.hard_exit = HardExit(enabled=self.options.hard_exit)
        self._current_step: int | None = None
        self._executing_since: float | None = None
        self._fenced: AttemptFenced | None = None
        self._drained_in = State.BOOTING  # the state a drain interrupted, for the exit line
        self._drained_in_step: int | None = None  # the step a drain interrupted, if it came during one
        self._first_tool_seen = False
        self._rng = random.Random()
        self.machine.add_listener(self._on_transition)

    # -- public control ---------------------------------------------------------------------------------

    @property
    def state(self) -> State:
        """The current lifecycle state."""
        return self.machine.state

    @property
    def draining(self) -> bool:
        """True once a drain was requested (by a signal or `request_drain`)."""
        return self._draining

    def _drain_pending(self) -> bool:
        return self._draining

    def notify(self, event: str, **info: Any) -> None:
        """Tell observers (the test harness) that ``event`` happened; never lets one break the run."""
        if event == "tool_started" and not self._first_tool_seen:
            self._first_tool_seen = True
            if self.settings is not None:
                self.telemetry.bootstrap_done(str(self.settings.data_dir), self.settings.job_id)
        for observer in list(self.observers):
            try:
                observer(event, info)
            except Exception:
                log.exception("runtime observer failed on %s", event)

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

    # -- the whole process -----------------------------------------------------------------------------

    async def run(self) -> int:
        """Run the lifecycle to TERMINATED and return the exit code."""
        self.drain_event = anyio.Event()
        if self.draining:
            self.drain_event.set()
        with self._logging():
            try:
                async with anyio.create_task_group() as services:
                    self._services = services
                    if self.options.handle_signals:
                        await services.start(self._receive_signals)
                    outcome = await self._lifecycle()
                    services.cancel_scope.cancel()
            except BaseException:
                self.hard_exit.disarm()
                raise
            self.hard_exit.settle(self.constants.drain.cleanup_budget_seconds, outcome.exit_code)
            self.exit_code = outcome.exit_code
            log.info(
                "exit %s: %s",
                outcome.exit_code,
                outcome.reason,
                extra=log_fields(exit_code=outcome.exit_code, reason=outcome.reason),
            )
            return outcome.exit_code

    async def _lifecycle(self) -> _Outcome:
        resume: _Resume | None = None
        outcome: _Outcome
        try:
            with anyio.CancelScope() as self._phase_scope:
                if self.draining:  # a signal caught during imports (EarlySignal) arrived before this scope
                    self._phase_scope.cancel()
                booted = await self._boot()
                self.machine.move(State.HYDRATING, "stores open")
                resume = await self._hydrate(booted)
            self._phase_scope = None
            if resume is None or self.draining:
                outcome = _Outcome(
                    EXIT_DRAINED,
                    f"drained during {_PHASE_NAMES.get(self._drained_in, self._drained_in.value.lower())}",
                )
            elif isinstance(resume.doc.status, str) and resume.doc.phase == "done":
                outcome = _Outcome(EXIT_DONE, f"job already {resume.doc.status}")
            else:
                outcome = await self._execute(resume)
        except BootFailure as exc:
            # The one ERROR line saying why the pod died (the transition and exit lines are INFO).
            log.error("fatal: %s", exc)
            outcome = _Outcome(EXIT_CRASH, str(exc))
        except AttemptFenced as exc:
            log.error("stopping: %s", exc)
            outcome = _Outcome(EXIT_CRASH, str(exc))
        except Exception as exc:
            outcome = await self._crashed(exc)
        await self._cleanup(outcome)
        return outcome

    # -- BOOTING ----------------------------------------------------------------------------------------

    async def _boot(self) -> Booted:
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
        self._start_services(settings, journal)
        store = self.store = store_from_url(settings.resolved_database_url)
        try:
            await store.open()  # bounded by the store's own connect timeout and tries
        except StoreUnavailable as exc:
            raise BootFailure(f"store unreachable: {self.redactor.redact(str(exc))}") from None
        self.board.store_has_free_connection = store.has_free_connection
        return Booted(settings, store, journal)

    def _modules_to_preload(self, settings: Settings) -> list[str]:
        modules: list[str] = []
        if settings.control_plane_url:
            modules.append("httpx")
        if self.env.get("ANTHROPIC_API_KEY"):
            modules.append("anthropic")
        if settings.qdrant_url or (settings.data_dir / "qdrant").exists():
            modules.append("qdrant_client")
        return modules

    def _open_journal(self, settings: Settings) -> Journal:
        try:
            session_dir = contained_session_dir(settings.data_dir, settings.job_id)
        except ConfigError as exc:
            raise BootFailure(f"configuration error: {exc}") from None
        journal = Journal.create(session_dir, settings.attempt, redactor=self.redactor)
        journal.append(
            "SESSION_STARTED",
            job_id=settings.job_id,
            agent_id=settings.agent_id,
            attempt=settings.attempt,
            pid=os.getpid(),
            pod_name=self.redactor.redact(settings.pod_name),
            previous_exit_code=settings.previous_exit_code,
        )
        return journal

    def _start_services(self, settings: Settings, journal: Journal) -> None:
        assert self._services is not None
        self._services.start_soon(journal.run_periodic_flush, 1.0)
        self._services.start_soon(run_lag_monitor, self.board, settings.constants.probe.lag_interval_seconds)
        if settings.control_plane_url:
            from agentlife._heartbeat import SseHeartbeat

            hb = settings.constants.heartbeat
            self._heartbeat = SseHeartbeat(
                settings.control_plane_url,
                settings.control_plane_token,
                agent_id=settings.agent_id,
                job_id=settings.job_id,
                pod_name=settings.pod_name,
                interval=hb.sse_interval_seconds,
                snapshot_metrics=self._heartbeat_metrics,
                board=self.board,
                reconnect_initial=hb.reconnect_initial_seconds,
                reconnect_max=hb.reconnect_max_seconds,
                redactor=self.redactor,
            )
            self._services.start_soon(self._heartbeat.run)

    def _start_job_heartbeat(self) -> None:
        from agentlife._heartbeat import JobHeartbeat

        assert self._services is not None and self.store is not None and self.settings is not None
        s = self.settings
        beat = JobHeartbeat(
            self.store,
            s.job_id,
            s.attempt,
            s.constants.heartbeat.job_interval_seconds,
            self.board,
            on_fenced=self._fenced_out,
            redactor=self.redactor,
        )
        self._services.start_soon(beat.run)

    def _fenced_out(self, exc: AttemptFenced) -> None:
        """A later attempt owns the job: stop the step loop now, exit 1, never write the row again."""
        log.error("fenced: %s; stopping the step loop", exc)
        self._fenced = exc
        if self._step_scope is not None:
            self._step_scope.cancel()

    def _start_probe_server(self) -> None:
        if not self.options.probes:
            return
        host = self.env.get("AGENTLIFE_HEALTH_HOST") or "0.0.0.0"
        raw_port = (self.env.get("AGENTLIFE_HEALTH_PORT") or "8086").strip()
        if raw_port.lower() == "off":
            return
        try:
            port = int(raw_port)
        except ValueError:
            return  # Settings reports the bad value as a configuration error right after this
        from agentlife._probes import ProbeServer

        threshold = self.constants.probe.blocked_threshold_seconds
        self._probe_server = ProbeServer(
            self.board, host, port, blocked_threshold=threshold, redactor=self.redactor
        )
        self._probe_server.start()

    # -- HYDRATING --------------------------------------------------------------------------------------

    async def _hydrate(self, booted: Booted) -> _Resume:
        hydrator = Hydrator(booted, redactor=self.redactor, telemetry=self.telemetry)
        self.notify("hydration_started")
        job_row = await hydrator.claim_job(create=self.options.create_job, payload=self.options.payload)
        self._start_job_heartbeat()
        job = self.job = Job(
            job_row.id, job_row.agent_id, booted.settings.attempt, job_row.payload, job_row.status
        )
        self.approvals = Approvals(booted, job, self, lambda: self._current_step)
        self.budget = Budget.build(self.constants.budget, job_row.token_budget, job_row.tokens_consumed)
        if job_row.status in _TERMINAL_STATUSES:
            log.info("job %s is already %s: nothing to do", job_row.id, job_row.status)
            return _Resume(CheckpointDoc(status=job_row.status, phase="done"), job_row.checkpoint_id)
        doc, checkpoint_id = await hydrator.load_checkpoint()
        self.checkpoint_id = checkpoint_id
        replay = await hydrator.scan_journal(checkpoint_id, doc)
        self.approvals.restore(doc, job_row.status)
        memories = await hydrator.fetch_memories(doc, job=job, agent=self.agent, open_memory=self.open_memory)
        if self._drain_pending():
            # The signal came while a memory call ran on a worker thread (no cancel reaches it) and its error
            # was handled, so the phase scope's cancel had no await to land on: drained, never READY.
            return _Resume(doc, checkpoint_id, replay, memories)
        self.machine.move(State.READY, "hydrated")
        # Built after READY: its ~120 ms of SDK imports would otherwise compete with boot for the GIL.
        # Everything recorded before then is buffered by the facade and replayed.
        self.telemetry.start_building(booted.settings, self.board, dict(self.env))
        self.notify("ready")
        return _Resume(doc, checkpoint_id, replay, memories)

    # -- EXECUTING --------------------------------------------------------------------------------------

    async def _execute(self, resume: _Resume) -> _Outcome:
        if self.draining:
            return _Outcome(EXIT_DRAINED, "drained before execution")
        self.machine.move(State.EXECUTING, "step loop")
        self._llm_client = self.agent.make_llm()
        doc, replay = resume.doc, resume.replay
        while doc.phase != "delivering":
            if self._drain_pending():  # a call, not the property: a signal may have come during the step
                return _Outcome(EXIT_DRAINED, self._drained_between_steps())
            try:
                result, doc = await self._run_step(doc, replay, resume.memories)
            except ParkRequested:
                return await self._park(doc)
            except BudgetExhausted as exc:
                log.error(str(exc))
                return await self._finish_failed_by_runtime(doc, str(exc))
            except Exception as exc:
                from agentlife._retry import classify

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
                return _Outcome(EXIT_DRAINED, f"step {doc.next_step} failed transiently during the drain")
            replay = None
            if self._fenced is not None:
                raise self._fenced
            if result is None:
                return _Outcome(EXIT_DRAINED, f"step {doc.next_step} cancelled at the drain deadline")
        return await self._deliver_and_finish(doc)

    def _approved(self) -> bool:
        return self.approvals is not None and self.approvals.approved

    def _drained_between_steps(self) -> str:
        if self._drained_in_step is None:
            return f"drained by {self.drain_reason} between steps"
        return (
            f"drained by {self.drain_reason} during step {self._drained_in_step}, "
            "which finished and was checkpointed"
        )

    async def _run_step(
        self, doc: CheckpointDoc, replay: ReplayMap | None, memories: list[MemoryRecord]
    ) -> tuple[Done | bool | None, CheckpointDoc]:
        """Run one step; returns (outcome, new doc). Outcome None means cancelled at the drain deadline."""
        assert self.job is not None and self.journal is not None and self.budget is not None
        assert self._llm_client is not None and self.settings is not None
        step = doc.next_step
        self.budget.check_run_time()
        # A private copy: a crashed or cancelled step must not leak half-made changes into a checkpoint.
        state = orjson.loads(orjson.dumps(doc.state, option=orjson.OPT_NON_STR_KEYS))
        assert self.approvals is not None
        env = CallEnv(
            self,
            self.approvals,
            self.journal,
            replay if replay and replay.step == step else None,
            self.budget,
            self._llm_client,
            self._rng,
        )
        ctx = StepContext(
            step=step,
            state=state,
            job=self.job,
            memories=memories,
            footprint=Footprint.after_exit(self.settings.previous_exit_code),
            env=env,
        )
        self._current_step = step
        self.board.update(step=step)
        self.journal.append("STEP_STARTED", step=step)
        self.notify("step_started", step=step)
        started = time.monotonic()
        outcome: Done | None = None
        with anyio.CancelScope() as scope, self.telemetry.step_span(step):
            self._step_scope = scope
            if self.drain_deadline is not None:
                scope.deadline = self.drain_deadline
            outcome = await self.agent.step(ctx)
        self._step_scope = None
        if scope.cancelled_caught:
            log.warning("step %s cancelled at the drain deadline; nothing checkpointed for it", step)
            return None, doc
        if outcome is not None and not isinstance(outcome, Done):
            raise TypeError(
                f"{type(self.agent).__name__}.step() must return Done or None, got {type(outcome).__name__}"
            )
        check_replayable(ctx.state, "ctx.state")
        if isinstance(outcome, Done):
            check_replayable(outcome.result, "Done.result")
        self.telemetry.step_completed(time.monotonic() - started)
        self.stats.steps_completed += 1
        if isinstance(outcome, Done):
            new = doc.evolve(
                next_step=step + 1,
                state=ctx.state,
                phase="delivering",
                result=outcome.result,
                status=outcome.status,
                reason=outcome.reason,
                approved=self._approved(),
            )
        else:
            new = doc.evolve(next_step=step + 1, state=ctx.state, phase="running", approved=self._approved())
        await self.write_checkpoint(new, step)
        self.notify("step_completed", step=step)
        return outcome or True, new

    async def write_checkpoint(self, doc: CheckpointDoc, step: int) -> None:
        """Store ``doc`` (fenced by attempt), retrying an unreachable store within the step budget."""
        assert self.store is not None and self.settings is not None and self.journal is not None
        s = self.settings
        data = doc.evolve(attempt=s.attempt, written_at=time.time()).encode()
        checkpoint_id = f"{s.attempt:04d}-{step:06d}-{uuid.uuid4().hex[:8]}"
        store = self.store
        crc = await self._retrying_store(
            "checkpoint write", lambda: store.write_checkpoint(s.job_id, s.attempt, checkpoint_id, step, data)
        )
        self.checkpoint_id = checkpoint_id
        self.stats.checkpoints_written += 1
        self.journal.append("CHECKPOINT_WRITTEN", step=step, checkpoint_id=checkpoint_id, crc=crc)
        await self.journal.flush(fsync=False)

    async def _deliver_and_finish(self, doc: CheckpointDoc) -> _Outcome:
        """Delivery first (at most once per channel), then the terminal status, then housekeeping."""
        from agentlife._delivery import DeliveryGuard, run_housekeeping

        assert self.store is not None and self.settings is not None
        s, status = self.settings, doc.status or JobStatus.COMPLETED
        retry = self.constants.retry
        guard = DeliveryGuard(
            self.store,
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
            return _Outcome(EXIT_DRAINED, "drain deadline reached during delivery; the next attempt delivers")
        await self.store.set_status(
            s.job_id,
            s.attempt,
            status,
            result=_row_result(doc.result, doc.reason),
            error=_failure_record(doc.reason, s.attempt) if status == "FAILED" else None,
        )
        if not self.draining:
            await run_housekeeping([lambda: self.agent.housekeeping(doc.result)])  # logs its own errors
            await self._store_memories(doc)
        self._enter_draining(f"job {status.lower()}")
        return _Outcome(EXIT_DONE, f"job {status}", status)

    async def _finish_failed_by_runtime(self, doc: CheckpointDoc, reason: str) -> _Outcome:
        assert self.store is not None and self.settings is not None
        s = self.settings
        await self.store.set_status(
            s.job_id,
            s.attempt,
            JobStatus.FAILED,
            result={"reason": reason},
            error=_failure_record(reason, s.attempt, "BudgetExhausted"),
        )
        self._enter_draining("job failed")
        return _Outcome(EXIT_DONE, reason, JobStatus.FAILED)

    def _enter_draining(self, reason: str) -> None:
        """Move to DRAINING after the job ended, unless a signal already did (SIGTERM during delivery)."""
        if self.state is not State.DRAINING:
            self.machine.move(State.DRAINING, reason)

    async def _park(self, doc: CheckpointDoc) -> _Outcome:
        # The park checkpoint's marker lands after the parked step's completed calls, and the next attempt
        # replays only what follows the marker: carry those calls past it, or they would run again.
        step_events = await self._step_events_since_checkpoint(doc.next_step)
        parked = doc.evolve(phase="awaiting_approval")
        await self.write_checkpoint(parked, max(doc.next_step - 1, 0))
        if step_events:
            assert self.journal is not None
            self.journal.carry_forward(step_events)
            await self.journal.flush(fsync=True)
        if self.draining:
            return _Outcome(EXIT_DRAINED, "drained while waiting for approval")
        self.machine.move(State.DRAINING, "parked: approval idle timeout")
        return _Outcome(
            EXIT_DONE, "parked: WAITING_FOR_APPROVAL after the idle timeout", JobStatus.WAITING_FOR_APPROVAL
        )

    async def _step_events_since_checkpoint(self, step: int) -> list[dict[str, Any]]:
        """This session's events of ``step`` after the current checkpoint's marker (best effort)."""
        from agentlife._journal import build_replay, scan_for_resume

        assert self.journal is not None and self.settings is not None
        session_dir, checkpoint_id = self.settings.session_dir, self.checkpoint_id
        budget = self.constants.hydration.buffer_scan_timeout_seconds
        try:
            await self.journal.flush(fsync=False)
            result = await anyio.to_thread.run_sync(
                lambda: scan_for_resume(
                    session_dir, checkpoint_id, budget_seconds=budget, checkpoint_step=step - 1
                )
            )
        except Exception as exc:
            log.warning("parking: cannot read the step's calls back (%s: %s)", type(exc).__name__, exc)
            return []
        if not result.found:
            log.warning("parking: the step's calls were not found in the journal: %s", result.reason)
            return []
        return build_replay(result.events, step).events_for_carry_forward()

    async def open_memory(self) -> QdrantMemory:
        """The memory client, opened on first use (its import overlapped boot on the preload thread)."""
        from agentlife._memory import QdrantMemory, collection_name

        assert self.settings is not None
        if self.memory is None:
            budget = self.constants.hydration.memory_timeout_seconds
            if self._preloader is not None:
                await anyio.to_thread.run_sync(
                    self._preloader.wait, "qdrant_client", 10.0, abandon_on_cancel=True
                )
            self.memory = QdrantMemory(
                url=self.settings.qdrant_url,
                path=self.settings.data_dir / "qdrant",
                collection=collection_name(self.settings.agent_id),
                embedder=self.agent.make_embedder(),
                # Its calls run on worker threads a cancel scope cannot stop: bound each by what is left of
                # the memory budget (qdrant-client's own 5 s would outlast a scaled budget).
                timeout=min(budget, max(0.0, anyio.current_effective_deadline() - anyio.current_time())),
            )
        return self.memory

    async def _store_memories(self, doc: CheckpointDoc) -> None:
        """Write the agent's memories of this job back, best effort, within the memory budget."""
        try:
            texts = self.agent.memories_to_store(doc.result, doc.state)
            if texts:
                with anyio.fail_after(self.constants.hydration.memory_timeout_seconds):
                    memory = await self.open_memory()
                    await memory.add(texts, {"job_id": self.job.id if self.job else None})
        except Exception as exc:
            log.warning("memory write-back failed: %s", self.redactor.redact(str(exc)))

    # -- crash ------------------------------------------------------------------------------------------

    async def _crashed(self, exc: BaseException) -> _Outcome:
        message = self.redactor.redact(f"{type(exc).__name__}: {exc}")
        log.error("crash in step %s: %s", self._current_step, message, exc_info=exc)
        from agentlife._policy import CrashRecord

        # The shape `should_retry_after_crash` reads back, plus what a person needs to debug it.
        record = CrashRecord.from_exception(
            exc,
            attempt=self.settings.attempt if self.settings else 0,
            exit_code=EXIT_CRASH,
            step=self._current_step,
            redact=self.redactor.redact,
        ).to_dict()
        record["state"] = self.state.value
        record["traceback"] = self.redactor.redact("".join(traceback.format_exception(exc)))[-4000:]
        if self.store is not None and self.settings is not None and self.job is not None:
            with anyio.move_on_after(self.constants.drain.cleanup_budget_seconds / 2, shield=True):
                try:
                    # The row's status as it is now, not as hydration saw it: a control plane that failed
                    # the job meanwhile (say, refusing a parked approval) must not be overruled by the crash.
                    row = await self.store.get_job(self.settings.job_id)
                    status = row.status if row is not None else self.job.status
                    await self.store.set_status(
                        self.settings.job_id,
                        self.settings.attempt,
                        status if status != JobStatus.PENDING else JobStatus.RUNNING,
                        error=record,
                    )
                except AgentlifeError as store_exc:
                    log.error(
                        "could not record the crash on the job row: %s", self.redactor.redact(str(store_exc))
                    )
        return _Outcome(EXIT_CRASH, f"crash: {message.splitlines()[0][:300]}")

    # -- DRAINING / cleanup -----------------------------------------------------------------------------

    async def _cleanup(self, outcome: _Outcome) -> None:
        """Flush and close everything inside the cleanup budget, shielded from cancellation."""
        budget = self.constants.drain.cleanup_budget_seconds
        if not self.draining:
            self._arm_hard_exit(budget, outcome.exit_code)  # the work is settled: keep its exit code
        with anyio.move_on_after(budget, shield=True) as scope:
            await self._close_resources()
        if scope.cancelled_caught:
            log.error("cleanup exceeded its %gs budget; exiting anyway", budget)
        if self._drain_started is not None:
            self.telemetry.drain(self.drain_reason or outcome.reason, time.monotonic() - self._drain_started)
        if self.state is not State.TERMINATED:
            self.machine.move(State.TERMINATED, outcome.reason)
        if self.journal is not None:
            self.journal.append(
                "SESSION_ENDED", exit_code=outcome.exit_code, reason=self.redactor.redact(outcome.reason)
            )
            with anyio.move_on_after(budget, shield=True):
                await _quietly("journal close", self.journal.aclose())
        await self._close_heartbeat()
        with anyio.move_on_after(min(2.0, budget), shield=True):
            await _quietly("telemetry shutdown", self.telemetry.ashutdown(min(2.0, budget)))
        if self._probe_server is not None:
            await _quietly("probe server stop", anyio.to_thread.run_sync(self._probe_server.stop))

    async def _close_resources(self) -> None:
        """One at a time, so a failure leaves the rest still closed (no gather of half-closed state)."""
        if self.journal is not None:
            await _quietly("journal flush", self.journal.flush(fsync=True))
        if self._llm_client is not None:
            await _quietly("LLM client close", self._llm_client.aclose())
        if self.memory is not None:
            await _quietly("memory close", self.memory.aclose())
        if self.store is not None:
            await _quietly("store close", self.store.close())

    async def _close_heartbeat(self) -> None:
        if self._heartbeat is None:
            return
        with anyio.move_on_after(min(1.0, self.constants.drain.cleanup_budget_seconds / 4), shield=True):
            await _quietly("heartbeat flush", self._heartbeat.flush(1.0))
        with anyio.move_on_after(1.0, shield=True):
            await _quietly("heartbeat close", self._heartbeat.aclose())

    # -- signals, hard deadline -------------------------------------------------------------------------

    def _receive_signals(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> Any:
        drain_budget = (
            self.constants.drain.step_deadline_seconds + self.constants.drain.cleanup_budget_seconds
        )
        return receive_drain_signals(
            self.request_drain,
            early=self.options.early_signal,
            on_signal_off_loop=lambda: self._arm_hard_exit(drain_budget, EXIT_DRAINED),
            task_status=task_status,
        )

    def _arm_hard_exit(self, seconds: float, code: int) -> None:
        """Exit with ``code`` if the process is still here after ``seconds`` plus half the SIGKILL buffer."""
        margin = min(self.constants.drain.sigkill_buffer_seconds / 2, 2.0)
        self.hard_exit.arm(seconds + margin, code)

    # -- listeners, usage, logging ----------------------------------------------------------------------

    def _on_transition(self, transition: Transition) -> None:
        self.board.update(state=transition.target)
        if transition.target is State.EXECUTING:
            self._executing_since = time.monotonic()
        elif transition.source is State.EXECUTING and self._executing_since is not None:
            # The execution half of the phase budget: EXECUTING until DRAINING (or a crash).
            self.telemetry.execution(time.monotonic() - self._executing_since)
        if self.journal is not None:
            self.journal.append(
                "LIFECYCLE",
                **{"from": transition.source.value, "to": transition.target.value},
                reason=self.redactor.redact(transition.reason),
            )
        log.info(
            "%s -> %s%s",
            transition.source,
            transition.target,
            f" ({transition.reason})" if transition.reason else "",
            extra=log_fields(transition_from=transition.source.value, transition_to=transition.target.value),
        )
        self.telemetry.record_transition(transition)
        if self._heartbeat is not None:
            self._heartbeat.push_lifecycle(transition)
        self.notify("transition", source=transition.source, target=transition.target)

    def _listener_failed(self, listener: Callable[[Transition], None], exc: BaseException) -> None:
        log.error("lifecycle listener %s failed: %s", getattr(listener, "__qualname__", listener), exc)

    async def _retrying_store(self, what: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """``call()``, retried with backoff while the store is unreachable, within the step budget."""
        deadline = anyio.current_time() + self.constants.drain.step_deadline_seconds
        delay = self.constants.retry.transient_initial_seconds
        while True:
            try:
                return await call()
            except StoreUnavailable as exc:
                if anyio.current_time() + delay > deadline:
                    raise
                log.warning("%s failed (%s); retrying in %.1fs", what, self.redactor.redact(str(exc)), delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, self.constants.retry.transient_max_seconds)

    async def add_usage(self, reply: LLMReply) -> None:
        """Add a call's usage to the job row and the in-memory budget.

        Retried like a checkpoint write while the store is unreachable: a short PostgreSQL outage must not
        crash the step after its LLM call succeeded. A retry after a commit whose answer was lost counts the
        call twice, which errs on the side of the budget.
        """
        assert self.store is not None and self.settings is not None and self.budget is not None
        store, s, usage = self.store, self.settings, reply.usage
        totals = await self._retrying_store(
            "usage update",
            lambda: store.add_usage(
                s.job_id, s.attempt, usage.input_tokens, usage.output_tokens, reply.cost_usd
            ),
        )
        self.budget.add(totals)

    def _heartbeat_metrics(self) -> dict[str, Any]:
        # rssMb and uptimeSeconds (from the kernel's process start) are the heartbeat stream's own.
        return {
            "stepsCompleted": self.stats.steps_completed,
            "llmCallsTotal": self.stats.llm_calls,
            "toolCallsTotal": self.stats.tool_calls,
        }

    def _log_context(self) -> dict[str, Any]:
        snap = self.board.snapshot()
        return {
            # Lines logged before the settings are read (the probe server's first) still name the job.
            "job_id": snap.job_id or self.options.job_id or self.env.get("AGENTLIFE_JOB_ID") or None,
            "agent_id": snap.agent_id or None,
            "attempt": snap.attempt or None,
            "state": snap.state.value,
            "step": snap.step,
        }

    def _logging(self) -> Any:
        from contextlib import nullcontext

        if not self.options.json_logs:
            return nullcontext()
        level = (self.env.get("AGENTLIFE_LOG_LEVEL") or "INFO").upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            level = "INFO"
        return installed_json_logging(
            level, context=self._log_context, redactor=self.redactor, stream=self.options.log_stream
        )


async def _quietly(what: str, awaitable: Any) -> None:
    """Await a cleanup step; its failure is one log line, and the settled exit code stands."""
    try:
        await awaitable
    except Exception as exc:
        log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)


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
