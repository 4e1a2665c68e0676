"""The lifecycle of one job: boot, hydrate, execute, drain, exit; `Runtime.run()` reads top to bottom.

Built of collaborators passed to each other: the process (`ProcessShell`, the job's own for ``run``, lent
by a worker), the job's `Drain`, `JobEvents`, `JobServices`, the `Hydrator`, `StepRunner` and `Finisher`.

* BOOTING: settings, session journal, store (the probe server already answers).
* HYDRATING: claim + checkpoint (mandatory), journal scan (5 s), memory fetch (10 s), in that order.
* READY → EXECUTING: the step loop, checkpointing after every completed step.
* DRAINING: on SIGTERM the step gets ``STEP_DEADLINE``, then cleanup runs shielded in ``CLEANUP_BUDGET``.
* TERMINATED, with the exit code (0, 1 or 143).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Mapping

import anyio.abc

from agentlife._agent import AgentProcess, Job
from agentlife._budget import Budget
from agentlife._checkpoint import CheckpointDoc
from agentlife._config import Settings, job_id_from_env
from agentlife._exceptions import AttemptFenced, BootFailure, BudgetExhausted, ConfigError, ParkRequested
from agentlife._exitcode import ExitCode
from agentlife._journal._writer import Journal
from agentlife._logging import job_attributes, job_log_context
from agentlife._retry import classify
from agentlife._runtime import _base
from agentlife._runtime._base import (
    Hydrated,
    Outcome,
    Resume,
    RunOptions,
)
from agentlife._runtime._drain import Drain
from agentlife._runtime._events import JobBoard, JobEvents, Observer, board_log_context
from agentlife._runtime._finish import Finisher, cleanup, record_crash
from agentlife._runtime._hydration import Hydrator
from agentlife._runtime._process import ProcessShell, ShellOptions, constants_or_default
from agentlife._runtime._services import JobServices, mcp_tools_for
from agentlife._runtime._steps import JobHost, StepRunner
from agentlife._state import State
from agentlife._step._approvals import Approvals
from agentlife._step._host import Booted
from agentlife.stores import JobStore

__all__ = ["RunOptions", "Runtime", "ShellOptions"]

log = logging.getLogger("agentlife.runtime")


class Runtime:
    """Runs one `AgentProcess` through its lifecycle and returns the process exit code.

    Args:
        agent: the agent instance.
        env: the environment (``AGENTLIFE_*``); default ``os.environ``.
        options: see `RunOptions`.
        shell: the process a worker lends (its board, telemetry, redactor); None: this job is the process.
        store: the worker's open store, lent for the job; None: the job opens and closes its own.
        mirror_board: the job's state and step also fill the board's one-job fields (one job at a time).
    """

    def __init__(
        self,
        agent: AgentProcess,
        *,
        env: Mapping[str, str] | None = None,
        options: RunOptions | None = None,
        shell: ProcessShell | None = None,
        store: JobStore | None = None,
        mirror_board: bool = True,
    ) -> None:
        self.agent, self.options = agent, options or RunOptions()
        self.env: Mapping[str, str] = dict(os.environ if env is None else env)
        self.constants = self.options.constants or constants_or_default(self.env)
        self.one_job = shell is None
        job_id = self.options.job_id or job_id_from_env(self.env) or ""
        self.shell = shell or ProcessShell(
            self.env, agent_id=agent.agent_id, constants=self.constants,
            options=self.options.shell,
            on_signal=self.request_drain, log_context=lambda: board_log_context(self.shell.board, job_id),
        )  # fmt: skip
        self.board = self.shell.board  # the process's status board (its probe port, for tests)
        entry = JobBoard.for_job(self.board, job_id, agent.agent_id, mirror=self.one_job or mirror_board)
        self.events = JobEvents(entry, self.shell.telemetry)
        self.drain = Drain(self.constants.drain.step_deadline_seconds)
        self.services = JobServices(agent, self.env, self.shell.redactor, self.events, lent_store=store)
        self.drain.add_listener(self._on_drain)
        self.exit_reason: str | None = None  # why the lifecycle ended (the exit line's reason)
        self._drained_in = State.BOOTING  # the state a drain interrupted, for the exit line
        self._runner: StepRunner | None = None
        self._claimed: Job | None = None  # once hydration claimed the row: a crash is recorded on it

    @property
    def observers(self) -> list[Observer]:  # Called with each runtime event (the test harness's hook).
        return self.events.observers

    @property
    def state(self) -> State:  # The current lifecycle state.
        return self.events.state

    @property
    def journal(self) -> Journal | None:  # This attempt's session journal, once boot opened it.
        return self.services.journal

    @property
    def store(self) -> JobStore | None:  # The job store, once boot opened it.
        return self.services.store

    @property
    def draining(self) -> bool:  # True once a drain was requested (by a signal or `request_drain`).
        return self.drain.draining

    def request_drain(self, reason: str) -> None:
        """Begin the drain (what SIGTERM does). A second request is logged and ignored."""
        if self.state is not State.TERMINATED or self.drain.draining:
            self.drain.request(reason)

    def _on_drain(self, reason: str) -> None:
        if self.one_job:
            self.shell.arm_drain_exit()
        if self.services.journal is not None:
            self.services.journal.append("DRAIN_STARTED", reason=reason)
        state = self._drained_in = self.state
        if state in (State.BOOTING, State.HYDRATING, State.READY, State.EXECUTING):
            with job_log_context(self.events.board.log_fields):  # the signal's task: name the job
                self.events.machine.move(State.DRAINING, reason)

    async def run(self) -> int:
        """Run the lifecycle to TERMINATED and return the exit code (a plain `int`, as a process's)."""
        if not self.one_job:
            return int((await self._run_job()).exit_code)
        async with self.shell:
            outcome = await self._run_job()
            return self.shell.exit(outcome.exit_code, outcome.reason)

    async def _run_job(self) -> Outcome:
        self.drain.open()
        with job_log_context(self.events.board.log_fields), contextlib.ExitStack() as scope:
            try:
                async with anyio.create_task_group() as tasks:
                    outcome = await self._lifecycle(tasks, scope)
                    tasks.cancel_scope.cancel()
            finally:
                self.events.board.close()
        self.exit_reason = outcome.reason
        return outcome

    async def _lifecycle(self, tasks: anyio.abc.TaskGroup, scope: contextlib.ExitStack) -> Outcome:
        booted: Booted | None = None
        hydrated: Hydrated | None = None
        try:
            with anyio.CancelScope() as phase, self.drain.cancelled(phase):
                booted = await self._boot(tasks, scope)
                if not self.drain.draining:  # a signal as the store opened on its thread: never hydrated
                    self.events.machine.move(State.HYDRATING, "stores open")
                    hydrated = await self._hydrate(booted, tasks)
            if hydrated is None or self.drain.draining:
                name = _base.PHASE_NAMES.get(self._drained_in, self._drained_in.value.lower())
                outcome = Outcome(ExitCode.DRAINED, f"drained during {name}")
            elif isinstance(hydrated.resume.doc.status, str) and hydrated.resume.doc.phase == "done":
                outcome = Outcome(ExitCode.DONE, f"job already {hydrated.resume.doc.status}")
            else:
                outcome = await self._execute(hydrated)
        except (BootFailure, AttemptFenced) as exc:
            # The one ERROR line saying why the job stopped (the transition and exit lines are INFO).
            log.error("%s: %s", "fatal" if isinstance(exc, BootFailure) else "stopping", exc)
            outcome = Outcome(ExitCode.CRASH, str(exc))
        except Exception as exc:
            outcome = await record_crash(
                exc, state=self.state, step=self._runner.current_step if self._runner else None,
                settings=booted.settings if booted else None, store=self.services.store,
                job=self._claimed, constants=self.constants, redactor=self.shell.redactor,
            )  # fmt: skip
        shell = self.shell if self.one_job else None
        await cleanup(outcome, self.services, self.events, self.drain, self.constants, shell)
        return outcome

    async def _boot(self, tasks: anyio.abc.TaskGroup, scope: contextlib.ExitStack) -> Booted:
        self.events.notify("booting")
        try:
            settings = Settings.from_env(
                self.env, job_id=self.options.job_id, agent_id=self.agent.agent_id or None,
                constants=self.options.constants,
            )  # fmt: skip
        except ConfigError as exc:
            raise BootFailure(f"configuration error: {exc}") from None
        if self.options.attempt is not None:  # claimed by a worker: the attempt is the row's
            settings = dataclasses.replace(settings, attempt=self.options.attempt, previous_exit_code=None)
        self.constants = settings.constants
        self.drain.step_deadline = self.constants.drain.step_deadline_seconds
        # Every span and measurement of this job names it, in a worker too (whose resource names no job).
        scope.enter_context(job_attributes(settings.job_id, settings.attempt))
        self.events.board.update(job_id=settings.job_id, agent_id=settings.agent_id, attempt=settings.attempt)
        if self.one_job:
            blocked = self.constants.probe.blocked_threshold_seconds
            self.board.update(pod_name=settings.pod_name, blocked_threshold_seconds=blocked)
            self.shell.start_lag_monitor(self.constants.probe.lag_interval_seconds)
        self.services.preload(settings)
        journal = self.services.open_journal(settings)
        self.services.start(tasks, settings, journal)
        store = await self.services.open_store(settings)
        if self.one_job:
            self.board.store_has_free_connection = store.has_free_connection
        self.events.end_bootstrap_at_first_tool(settings)
        return Booted(settings, store, journal)

    async def _hydrate(self, booted: Booted, tasks: anyio.abc.TaskGroup) -> Hydrated | None:
        redactor, telemetry = self.shell.redactor, self.shell.telemetry
        hydrator = Hydrator(booted, redactor=redactor, telemetry=telemetry)
        self.events.notify("hydration_started")
        o = self.options
        row = await hydrator.claim_job(create=o.create_job, payload=o.payload, claimed=o.claimed)
        host = JobHost(self.agent, self.constants, self.drain, redactor, telemetry, self.events)
        runner = self._runner = StepRunner(host, booted)
        runner.limiter = self.shell.rate_limiter(booted.store, booted.settings)
        runner.deltas = self.services.start_job_tasks(tasks, booted, runner.fenced_out)
        job = self._claimed = Job(row.id, row.agent_id, booted.settings.attempt, row.payload, row.status)
        approvals = Approvals(booted, job, self.drain, lambda: runner.current_step)
        budget = Budget.build(self.constants.budget, row.token_budget, row.tokens_consumed)
        if row.status in _base.NOT_RUN_STATUSES:
            log.info("job %s is already %s: nothing to do", row.id, row.status)
            done = Resume(CheckpointDoc(status=row.status, phase="done"), row.checkpoint_id)
            return Hydrated(job, budget, approvals, done)
        doc, checkpoint_id = await hydrator.load_checkpoint()
        runner.checkpoint_id, runner.incarnation = checkpoint_id, row.incarnation
        conversation = await hydrator.load_conversation(doc)
        runner.records, replay = await hydrator.replay_map(checkpoint_id, doc, runner.step_journal, row)
        approvals.restore(doc)
        memories = await hydrator.fetch_memories(
            doc, job=job, agent=self.agent, open_memory=lambda: self.services.open_memory(booted.settings)
        )
        mcp = self.services.mcp_tools = mcp_tools_for(self.agent)
        if mcp is not None:  # the optional MCP step: this job's servers, started and listed
            await mcp.hydrate(booted, tasks, replay, runner.records, redactor=redactor, telemetry=telemetry)
        resume = Resume(doc, checkpoint_id, replay, memories, conversation)
        hydrated = Hydrated(job, budget, approvals, resume)
        if self.drain.draining:
            # The signal came while a memory call ran on a worker thread (no cancel reaches it) and its error
            # was handled, so the phase scope's cancel had no await to land on: drained, never READY.
            return hydrated
        self.events.machine.move(State.READY, "hydrated")
        # Built after READY (once per process): its ~120 ms of SDK imports would otherwise compete with boot
        # for the GIL. Everything recorded before then is buffered by the facade and replayed.
        self.shell.start_telemetry(booted.settings, one_job=self.one_job)
        self.events.notify("ready")
        return hydrated

    async def _execute(self, hydrated: Hydrated) -> Outcome:
        if self.drain.draining:
            return Outcome(ExitCode.DRAINED, "drained before execution")
        self.events.machine.move(State.EXECUTING, "step loop")
        runner = self._runner
        assert runner is not None  # built by hydration
        return await self._step_loop(hydrated, runner, Finisher(runner, self.services))

    async def _step_loop(self, hydrated: Hydrated, runner: StepRunner, finisher: Finisher) -> Outcome:
        llm = self.services.llm = self.agent.make_llm()
        doc, replay = hydrated.resume.doc, hydrated.resume.replay
        while doc.phase != "delivering":
            if self.drain.draining:  # read before each step: a signal may have come during the last
                return Outcome(ExitCode.DRAINED, runner.drained_between_steps())
            try:
                result, doc = await runner.run_step(hydrated, llm, doc, replay)
            except ParkRequested as parked:
                return await runner.park(doc, parked)
            except Exception as exc:
                return await self._step_failed(exc, hydrated, runner, finisher, doc)
            replay = None
            if runner.fenced is not None:
                raise runner.fenced
            if result is None:
                return Outcome(ExitCode.DRAINED, f"step {doc.next_step} cancelled at the drain deadline")
        return await finisher.deliver_and_finish(hydrated.job, doc)

    async def _step_failed(
        self, exc: Exception, hydrated: Hydrated, runner: StepRunner, finisher: Finisher, doc: CheckpointDoc
    ) -> Outcome:
        """How a step that raised ends the job: refused, out of budget, drained, or (re-raised) a crash."""
        if hydrated.approvals.rejection is not None:  # whatever the step raised after a refusal
            return finisher.rejected(hydrated.approvals.rejection)
        if isinstance(exc, BudgetExhausted):
            log.error(str(exc))
            return await finisher.failed_by_runtime(str(exc))
        if not (self.drain.draining and runner.fenced is None and classify(exc).retryable):
            raise exc
        # The drain left no time to retry a transient error: the step is as resumable as one cancelled at
        # the deadline (its completed calls are journaled). A crash record here would count a drain against
        # the job's crash policy (same error 3x -> dead letter).
        log.warning(
            "step %s failed during the drain with %s: %s; not retried now, the next attempt resumes the step",
            doc.next_step, type(exc).__name__, self.shell.redactor.redact(str(exc)),
        )  # fmt: skip
        return Outcome(ExitCode.DRAINED, f"step {doc.next_step} failed transiently during the drain")
