"""The warm pool: a process that boots once and runs jobs one after another (``python -m agentlife worker``).

`Worker` owns what lives as long as the process: the JSON logs, the signal receiver and the hard exit, the
probe server and its status board, telemetry, the store connection, the lag monitor, the zombie reaper and
the runnable-jobs gauge. Each job it claims (``CheckpointStore.claim_next``: the oldest runnable row of its
agent, attempt bumped) runs in a `JobRun`: the `Runtime` of ``_lifecycle`` with those services lent to it,
so the journal, hydration, steps, delivery and the drain are the very code ``run`` uses, on a fresh agent
instance that nothing of the previous job reaches.

Between jobs the worker polls (short interval, doubling while idle up to a cap). A drained job is handed
back (RUNNING -> PENDING, runnable at once by another worker); a crashed job gets the verdict of
`agentlife.should_retry_after_crash` (RETRYING, or DEAD_LETTER / FAILED) and the worker goes on, so a
poison job cannot take the pool down. Exit codes: 143 after a drain (SIGTERM, busy or idle), 0 after the
idle timeout or ``max_jobs`` jobs, 1 when the store cannot be reached at boot.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from agentlife._config import Settings
from agentlife._exceptions import AgentlifeError, ConfigError
from agentlife._logging import log_fields, process_logging
from agentlife._observe._lag import run_lag_monitor
from agentlife._observe._status import StatusBoard
from agentlife._observe._telemetry_facade import TelemetryFacade
from agentlife._redact import Redactor
from agentlife._runtime._base import EXIT_CRASH, EXIT_DONE, EXIT_DRAINED, Outcome, RunOptions
from agentlife._runtime._lifecycle import Runtime
from agentlife._runtime._services import quietly
from agentlife._runtime._signals import HardExit, receive_drain_signals
from agentlife._state import State
from agentlife.constants import Constants
from agentlife.stores import JobRecord, JobStatus, store_from_url
from agentlife.stores._jobs import is_crash, since_last_retry
from agentlife.stores._policy import should_retry_after_crash

if TYPE_CHECKING:
    from agentlife._agent import AgentProcess
    from agentlife.stores import CheckpointStore

__all__ = ["EXIT_IDLE", "JobRun", "Worker", "WorkerOptions"]

log = logging.getLogger("agentlife.worker")

#: The worker's exit code after its idle timeout or its ``max_jobs``: it did all it was asked to.
EXIT_IDLE = 0
#: How a job run by a worker ended, by the exit code its lifecycle would have given a process of its own.
JOB_OUTCOMES = {EXIT_DONE: "done", EXIT_DRAINED: "drained", EXIT_CRASH: "crashed"}
#: The reaper runs this many times per threshold, so a dead process's row is reclaimed within
#: threshold + threshold / 5 of its last heartbeat.
REAPS_PER_THRESHOLD = 5


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a worker runs.

    Attributes:
        agent_id: the agent whose jobs it claims (default: ``AGENTLIFE_AGENT_ID``, else the class's).
        idle_timeout: seconds without a job after which it exits 0.
        max_jobs: exit 0 after this many jobs (None: no limit).
        poll_interval: the first wait after finding no job; doubled while idle up to ``max_poll_interval``.
        max_poll_interval: the longest wait between two claims while idle.
        constants: use these instead of reading them from the environment.
        handle_signals: install the SIGTERM/SIGINT receiver (main thread only).
        json_logs: route logging through the JSON handler.
        hard_exit: ``os._exit`` when the drain overruns its budget.
        probes: start the probe server.
        log_stream: where JSON logs go (default stdout).
        early_signal: a signal caught while the agent class was imported.
    """

    agent_id: str | None = None
    idle_timeout: float = 1800.0
    max_jobs: int | None = None
    poll_interval: float = 0.05
    max_poll_interval: float = 1.0
    constants: Constants | None = None
    handle_signals: bool = True
    json_logs: bool = True
    hard_exit: bool = True
    probes: bool = True
    log_stream: Any = None
    early_signal: Any = None


class JobRun(Runtime):
    """One claimed job, run by the `Runtime` with the worker's store, board, telemetry and logs.

    Signals, the probe server and the hard exit stay with the worker; the job's journal, job heartbeat,
    LLM client and memory client are its own and are closed when it ends.
    """

    def __init__(self, agent: AgentProcess, worker: Worker, row: JobRecord) -> None:
        env = {k: v for k, v in worker.env.items() if k != "AGENTLIFE_PREVIOUS_EXIT_CODE"}
        env.update(AGENTLIFE_JOB_ID=row.id, AGENTLIFE_ATTEMPT=str(row.attempt))
        options = RunOptions(
            job_id=row.id,
            handle_signals=False,
            json_logs=False,
            hard_exit=False,
            probes=False,
            constants=worker.constants,
        )
        super().__init__(agent, env=env, options=options)
        self.owns_process = False
        self.board = worker.board
        self.telemetry = worker.telemetry
        self._worker_store = worker.store

    async def _open_store(self, settings: Settings) -> CheckpointStore:
        assert self._worker_store is not None
        return self._worker_store

    def _log_exit(self, outcome: Outcome) -> None:
        # The process goes on: "exit 0" here would read as the worker's own exit.
        ended = JOB_OUTCOMES.get(outcome.exit_code, "crashed")
        job_id, attempt = self.options.job_id, self.env.get("AGENTLIFE_ATTEMPT")
        log.info(
            "job %s attempt %s %s: %s",
            job_id,
            attempt,
            ended,
            outcome.reason,
            extra=log_fields(event="job_ended", outcome=ended, reason=outcome.reason),
        )


class Worker:
    """A process that claims and runs jobs of one agent class until drained, idle or done.

    Args:
        agent_cls: the `AgentProcess` subclass; one fresh instance per job.
        env: the process environment (``AGENTLIFE_*``).
        options: see `WorkerOptions`.
    """

    def __init__(
        self, agent_cls: type[AgentProcess], *, env: Mapping[str, str] | None = None, options: WorkerOptions
    ) -> None:
        self.agent_cls = agent_cls
        self.options = options
        self.env: dict[str, str] = dict(os.environ if env is None else env)
        self.constants = options.constants or Constants.from_env(self.env)
        self.agent_id = options.agent_id or self.env.get("AGENTLIFE_AGENT_ID") or agent_cls.agent_id or ""
        if not self.agent_id:
            raise ConfigError("no agent id: pass --agent-id, set AGENTLIFE_AGENT_ID or the class's agent_id")
        self.env["AGENTLIFE_AGENT_ID"] = self.agent_id
        self.redactor = Redactor.from_env(self.env)
        self.board = StatusBoard(job_id="", agent_id=self.agent_id, attempt=0)
        self.telemetry = TelemetryFacade()
        self.hard_exit = HardExit(enabled=options.hard_exit)
        self.store: CheckpointStore | None = None
        self.current: JobRun | None = None
        self.draining = False
        self.drain_reason: str | None = None
        self.jobs_done = 0
        self.jobs_crashed = 0
        #: Every job this process ran: (job id, attempt, exit code).
        self.history: list[tuple[str, int, int]] = []
        self._wake: anyio.Event | None = None
        self._probe_server: Any = None
        #: Why the last job's lifecycle ended (its exit line's reason), for a crash it did not record.
        self._job_exit_reason: str | None = None

    # -- the process ---------------------------------------------------------------------------------

    async def run(self) -> int:
        """Boot, take jobs until drained, idle or done, close everything; return the exit code."""
        self._wake = anyio.Event()
        with self._logging():
            try:
                async with anyio.create_task_group() as services:
                    if self.options.handle_signals:
                        await services.start(self._receive_signals)
                    code, reason = await self._serve(services)
                    services.cancel_scope.cancel()
            except BaseException:
                self.hard_exit.disarm()
                raise
            self.hard_exit.settle(self.constants.drain.cleanup_budget_seconds, code)
            log.info("exit %s: %s", code, reason, extra=log_fields(exit_code=code, reason=reason))
            return code

    def request_drain(self, reason: str) -> None:
        """What SIGTERM does: drain the current job as ``run`` would, take no other, exit 143."""
        if self.draining:
            log.warning("%s received during drain: ignored until cleanup is over", reason)
            return
        self.draining, self.drain_reason = True, reason
        drain = self.constants.drain
        margin = min(drain.sigkill_buffer_seconds / 2, 2.0)
        self.hard_exit.arm(drain.step_deadline_seconds + drain.cleanup_budget_seconds + margin, EXIT_DRAINED)
        self.board.update_worker(state="draining")
        log.info("drain requested by %s", reason, extra=log_fields(reason=reason))
        if self.current is not None:
            self.current.request_drain(reason)
        if self._wake is not None:
            self._wake.set()

    def _drain_pending(self) -> bool:
        return self.draining

    async def _serve(self, services: anyio.abc.TaskGroup) -> tuple[int, str]:
        self.board.update_worker(
            state="booting", jobs_done=0, jobs_crashed=0, current_job=None, runnable_jobs={}
        )
        self._start_probe_server()
        settings = Settings.from_env(
            self.env, job_id="worker", agent_id=self.agent_id, constants=self.constants
        )
        logging.getLogger().setLevel(settings.log_level)
        self.board.update(
            agent_id=self.agent_id,
            pod_name=settings.pod_name,
            blocked_threshold_seconds=self.constants.probe.blocked_threshold_seconds,
        )
        store = self.store = store_from_url(settings.resolved_database_url)
        try:
            try:
                await store.open()
            except AgentlifeError as exc:
                log.error("fatal: store unreachable: %s", self.redactor.redact(str(exc)))
                return EXIT_CRASH, "store unreachable"
            try:
                # One query of the job table now: a database without the schema (or one older than job
                # operations) is a fatal boot error naming `db init`, not a claim that fails for ever.
                await store.count_runnable()
            except AgentlifeError as exc:
                log.error("fatal: the store cannot serve jobs: %s", self.redactor.redact(str(exc)))
                return EXIT_CRASH, "store not usable"
            self.board.store_has_free_connection = store.has_free_connection
            services.start_soon(run_lag_monitor, self.board, self.constants.probe.lag_interval_seconds)
            services.start_soon(self._reap_periodically, store)
            services.start_soon(self._count_periodically, store)
            self.telemetry.start_building(settings, self.board, dict(self.env), one_job=False)
            self.board.update(state=State.READY)
            log.info(
                "worker ready: taking jobs of agent %s",
                self.agent_id,
                extra=log_fields(agent_id=self.agent_id, pid=os.getpid()),
            )
            return await self._take_jobs(store)
        finally:
            await self._close(store)

    async def _take_jobs(self, store: CheckpointStore) -> tuple[int, str]:
        opts = self.options
        idle_since, delay = time.monotonic(), opts.poll_interval
        while True:
            if self.draining:
                return EXIT_DRAINED, f"drained by {self.drain_reason} after {len(self.history)} jobs"
            if opts.max_jobs is not None and len(self.history) >= opts.max_jobs:
                return EXIT_IDLE, f"ran {len(self.history)} jobs (--max-jobs)"
            self.board.update_worker(state="idle", current_job=None)
            row = await self._claim(store)
            if row is None:
                idle = time.monotonic() - idle_since
                if idle >= opts.idle_timeout:
                    return EXIT_IDLE, f"idle for {idle:.1f}s (--idle-timeout {opts.idle_timeout:g})"
                if await self._wait_for_work(store, min(delay, opts.idle_timeout - idle)):
                    delay = opts.poll_interval  # a sign of work: claim at once, and poll briskly after
                else:
                    delay = min(delay * 2, opts.max_poll_interval)
                continue
            if self._drain_pending():  # the signal came while the claim ran: the row goes straight back
                await self._hand_back(store, row, "claimed during the drain")
                continue
            await self._run_job(store, row)
            idle_since, delay = time.monotonic(), opts.poll_interval

    async def _wait_for_work(self, store: CheckpointStore, seconds: float) -> bool:
        """Until the store signals work for this agent, the reaper or a drain wakes us, or ``seconds``."""
        woken = False
        wake = self._wake
        assert wake is not None

        async def store_signal() -> None:
            nonlocal woken
            woken = await store.wait_for_work(self.agent_id, seconds)
            scope.cancel()

        async def wake_event() -> None:
            nonlocal woken
            await wake.wait()
            woken = True
            scope.cancel()

        with anyio.move_on_after(seconds) as scope:
            async with anyio.create_task_group() as waits:
                waits.start_soon(store_signal)
                waits.start_soon(wake_event)
        return woken

    async def _claim(self, store: CheckpointStore) -> JobRecord | None:
        """The next job, or None; a failed claim makes the worker unready until a claim works again."""
        try:
            row = await store.claim_next(self.agent_id)
        except Exception as exc:  # an outage, or a row no store code foresaw: the pool goes on either way
            why = self.redactor.redact(f"{type(exc).__name__}: {exc}")
            log.warning("claim failed: %s", why)
            self.board.update_worker(claim_error=why)
            return None
        self.board.update_worker(claim_error=None)
        return row

    async def _run_job(self, store: CheckpointStore, row: JobRecord) -> None:
        self.board.update_worker(state="busy", current_job=row.id, attempt=row.attempt)
        log.info(
            "claimed job %s (attempt %s)",
            row.id,
            row.attempt,
            extra=log_fields(job_id=row.id, attempt=row.attempt),
        )
        try:
            agent = self.agent_cls()
        except Exception as exc:
            log.error("creating %s() failed: %s", self.agent_cls.__name__, exc)
            await self._after_crash(store, row, f"{type(exc).__name__}: {exc}")
            return
        job = self.current = JobRun(agent, self, row)
        if self.draining:
            job.request_drain(self.drain_reason or "SIGTERM")
        try:
            code = await job.run()
        finally:
            self.current = None
        self._job_exit_reason = job.exit_reason
        self.history.append((row.id, row.attempt, code))
        await self._drop_claim(store, row)
        if code == EXIT_DRAINED:
            await self._hand_back(store, row, "drained")
        elif code == EXIT_DONE:
            self.jobs_done += 1
        else:
            self.jobs_crashed += 1
            await self._after_crash(store, row, None)
        self.board.update(state=State.READY, job_id="", attempt=0, step=None)
        self.board.update_worker(jobs_done=self.jobs_done, jobs_crashed=self.jobs_crashed)

    async def _drop_claim(self, store: CheckpointStore, row: JobRecord) -> None:
        """This worker goes on without the job: a job it parked for approval must not look attended."""
        with anyio.CancelScope(shield=True):
            try:
                await store.drop_claim(row.id)
            except AgentlifeError as exc:
                log.warning("could not drop the claim on job %s: %s", row.id, self.redactor.redact(str(exc)))

    async def _hand_back(self, store: CheckpointStore, row: JobRecord, why: str) -> None:
        """A job this worker stopped without finishing: runnable again at once, for any worker."""
        with anyio.CancelScope(shield=True):
            try:
                if await store.release(row.id, row.attempt, JobStatus.PENDING):
                    log.info(
                        "job %s handed back (%s): runnable again",
                        row.id,
                        why,
                        extra=log_fields(job_id=row.id),
                    )
                # else: parked, finished, cancelled or taken over meanwhile: not ours to hand back
            except AgentlifeError as exc:
                log.warning(
                    "could not hand job %s back (the reaper will): %s", row.id, self.redactor.redact(str(exc))
                )

    async def _after_crash(self, store: CheckpointStore, row: JobRecord, message: str | None) -> None:
        """The crash is on the row (as ``run`` records it); its retry is decided now, not by the reaper.

        `should_retry_after_crash` on the row's crash history: RETRYING after the backoff schedule's delay
        (5 s, 60 s, 300 s, 1800 s), or DEAD_LETTER / FAILED. A crash the engine did not record (the agent
        class could not be built, ``message``; or the job's boot failed: a job id no path may hold, a
        conversation that does not verify) is recorded here first, so the policy counts it like any other.
        """
        with anyio.CancelScope(shield=True):
            try:
                current = await store.get_job(row.id)
                if current is None or current.status != JobStatus.RUNNING or current.attempt != row.attempt:
                    return
                if not any(is_crash(e) and e.get("attempt") == row.attempt for e in current.error):
                    current = await self._record_crash(store, row, message)
                    if current is None:
                        return
                verdict = should_retry_after_crash(
                    since_last_retry(current.error),
                    current.token_budget,
                    current.tokens_consumed,
                    constants=self.constants,
                )
                status = JobStatus.RETRYING if verdict.retry else verdict.status
                delay = verdict.delay_seconds if verdict.retry else 0.0
                if await store.release(row.id, row.attempt, status, delay_seconds=delay):
                    log.warning(
                        "job %s crashed: %s%s (%s)",
                        row.id,
                        status,
                        f" in {delay:g}s" if verdict.retry else "",
                        verdict.reason,
                        extra=log_fields(job_id=row.id, decision=str(status), not_before_in=delay),
                    )
            except AgentlifeError as exc:
                log.warning("could not settle crashed job %s: %s", row.id, self.redactor.redact(str(exc)))

    async def _record_crash(
        self, store: CheckpointStore, row: JobRecord, message: str | None
    ) -> JobRecord | None:
        """Append the crash record the engine could not write; the row as it is then."""
        if message is not None:
            error_class, why = "AgentInitFailed", message
        else:
            error_class, why = "BootFailure", self._job_exit_reason or "the job failed before its first step"
        error: dict[str, Any] = {"at": time.time(), "attempt": row.attempt, "exit_code": EXIT_CRASH}
        error.update(error_class=error_class, message=self.redactor.redact(why))
        await store.set_status(
            row.id, row.attempt, JobStatus.RUNNING, error=error, expect=(JobStatus.RUNNING,)
        )
        return await store.get_job(row.id)

    # -- background duties ---------------------------------------------------------------------------

    async def _reap_periodically(self, store: CheckpointStore) -> None:
        """The zombie reaper: RUNNING rows whose heartbeat stopped go back to RETRYING (or dead letter).

        Rows whose claiming process ran in this pid namespace and has exited are reaped as soon as their
        heartbeat is one job heartbeat interval old (a fresh heartbeat always wins), not after the
        threshold: the first pass runs at boot and the passes come at least once per heartbeat interval,
        so a worker container restarted in place (OOM-killed, crashed) takes its predecessor's job back
        within about one interval plus the first backoff step.
        """
        heartbeat = self.constants.heartbeat
        threshold = heartbeat.zombie_after_seconds
        period = min(threshold / REAPS_PER_THRESHOLD, heartbeat.job_interval_seconds)
        while True:
            try:
                decisions = await store.reap(threshold, constants=self.constants, dead_owners=True)
            except Exception as exc:  # an outage, or a row no store code foresaw: never the pool's end
                log.warning("reaper: %s", self.redactor.redact(f"{type(exc).__name__}: {exc}"))
                decisions = []
            for d in decisions:
                log.warning(
                    "reaped job %s: heartbeat %.1fs old -> %s (next attempt %s): %s",
                    d.job_id,
                    d.heartbeat_age_seconds,
                    d.status,
                    d.attempt,
                    d.reason,
                    # The reaped job's own id and attempt, not those of the job this worker is running.
                    extra=log_fields(
                        event="reaped",
                        job_id=d.job_id,
                        agent_id=d.agent_id,
                        attempt=d.attempt - 1,
                        step=None,
                        reaped_job_id=d.job_id,
                        decision=d.status,
                        new_attempt=d.attempt,
                        not_before=d.not_before,
                        circuit_open=d.circuit_open,
                    ),
                )
            if decisions and self._wake is not None and not self.draining:
                self._wake.set()  # a reaped row may be runnable at once
                self._wake = anyio.Event()
            await anyio.sleep(period)

    async def _count_periodically(self, store: CheckpointStore) -> None:
        """Refresh the ``agentlife_runnable_jobs`` gauge (counted here, never on the probe thread)."""
        period = self.constants.probe.readiness_period_seconds
        while True:
            try:
                counts = await store.count_runnable()
                self.board.update_worker(runnable_jobs={self.agent_id: 0, **counts}, counted_at=time.time())
            except Exception as exc:  # the gauge goes stale; the pool goes on
                log.warning(
                    "counting runnable jobs: %s", self.redactor.redact(f"{type(exc).__name__}: {exc}")
                )
            await anyio.sleep(period)

    # -- process services ----------------------------------------------------------------------------

    def _start_probe_server(self) -> None:
        if not self.options.probes:
            return
        raw_port = (self.env.get("AGENTLIFE_HEALTH_PORT") or "8086").strip()
        if raw_port.lower() == "off":
            return
        from agentlife._observe._probes import ProbeServer

        self._probe_server = ProbeServer(
            self.board,
            self.env.get("AGENTLIFE_HEALTH_HOST") or "0.0.0.0",
            int(raw_port),
            blocked_threshold=self.constants.probe.blocked_threshold_seconds,
            redactor=self.redactor,
        )
        self._probe_server.start()

    async def _close(self, store: CheckpointStore) -> None:
        self.board.update_worker(state="stopping", current_job=None)
        budget = self.constants.drain.cleanup_budget_seconds
        with anyio.move_on_after(budget, shield=True):
            await quietly("store close", store.close())
        with anyio.move_on_after(min(2.0, budget), shield=True):
            await quietly("telemetry shutdown", self.telemetry.ashutdown(min(2.0, budget)))
        self.board.update(state=State.TERMINATED)
        if self._probe_server is not None:
            with anyio.CancelScope(shield=True):
                await quietly("probe server stop", anyio.to_thread.run_sync(self._probe_server.stop))

    def _receive_signals(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> Any:
        drain = self.constants.drain
        budget = (
            drain.step_deadline_seconds
            + drain.cleanup_budget_seconds
            + min(drain.sigkill_buffer_seconds / 2, 2.0)
        )
        return receive_drain_signals(
            self.request_drain,
            early=self.options.early_signal,
            on_signal_off_loop=lambda: self.hard_exit.arm(budget, EXIT_DRAINED),
            task_status=task_status,
        )

    def _log_context(self) -> dict[str, Any]:
        snap = self.board.snapshot()
        return {
            "job_id": snap.job_id or None,
            "agent_id": snap.agent_id or None,
            "attempt": snap.attempt or None,
            "state": snap.state.value,
            "step": snap.step,
        }

    def _logging(self) -> Any:
        return process_logging(
            self.env,
            enabled=self.options.json_logs,
            context=self._log_context,
            redactor=self.redactor,
            stream=self.options.log_stream,
        )
