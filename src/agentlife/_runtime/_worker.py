"""The warm pool: a process that boots once and runs jobs of one agent, up to ``concurrency`` at a time.

`Worker` holds the process (`ProcessShell`: logs, signals and hard exit, probes and status board,
telemetry, lag monitor), the store connection, the zombie reaper and the runnable-jobs gauge. It runs
``concurrency`` slots in one task group; each slot claims a job (``WorkQueue.claim_next``: the oldest
runnable row of its agent, attempt bumped) and runs it in its own `Runtime` (the lifecycle ``run`` uses,
with the worker's shell and store lent to it) on a fresh agent instance, in its own task, cancel scope and
log context. A job's crash, budget failure or replay mismatch ends that job only.

Idle slots wait together: one of them asks the store (``wait_for_work``, racing the worker's own wake
event) and wakes the others when there is a sign of work; a claim that finds a job wakes them too. The
slots claim one at a time: concurrent claims of one worker would race for the same head of the queue (each
skipping the rows the others lock) and hold a connection each, so a burst of free slots would open every
connection of the pool at once; one after another, each takes the next row on a connection already open. A
drained job is handed back (RUNNING -> PENDING, runnable at once by another worker); a crashed job gets
the verdict of `agentlife.should_retry_after_crash` (RETRYING, or DEAD_LETTER / FAILED) and the slot goes
on, so a poison job cannot take the pool down. Exit codes: 143 after a drain (SIGTERM, busy or idle), 0
after the idle timeout (no job running or claimed for that long) or ``max_jobs`` jobs, 1 when the store
cannot be reached at boot.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc
import anyio.lowlevel

from agentlife._config import Settings
from agentlife._exceptions import ConfigError, describe_error
from agentlife._exitcode import ExitCode
from agentlife._logging import log_fields
from agentlife._runtime._base import RunOptions
from agentlife._runtime._drain import Drain
from agentlife._runtime._lifecycle import Runtime
from agentlife._runtime._process import ProcessShell, ShellOptions, quietly
from agentlife._runtime._retention import RETENTION_PERIOD_SECONDS, apply_retention
from agentlife._state import State
from agentlife.constants import Constants
from agentlife.stores import CheckpointStore, JobRecord, JobStatus, ReapDecision, store_from_url
from agentlife.stores._jobs import is_crash, since_last_retry
from agentlife.stores._limits import claim_limits_from_env
from agentlife.stores._policy import should_retry_after_crash

if TYPE_CHECKING:
    from agentlife._agent import AgentProcess
    from agentlife.stores import Handback, JobRows, JobStore, WorkQueue

    class WorkerStore(JobStore, WorkQueue, Protocol):
        """What a worker uses of its store: its queue, and each job it runs."""


__all__ = ["ShellOptions", "Worker", "WorkerOptions", "job_run"]

log = logging.getLogger("agentlife.worker")

#: How a job run by a worker ended, by the exit code its lifecycle would have given a process of its own.
JOB_OUTCOMES: dict[int, str] = {ExitCode.DONE: "done", ExitCode.DRAINED: "drained", ExitCode.CRASH: "crashed"}
#: The slowest idle poll when the store notifies new work (PostgreSQL): a notification lost with a dropped
#: connection, or a retry whose backoff ended (nothing notifies that), waits at most this long.
NOTIFY_FALLBACK_POLL_SECONDS = 5.0
#: The PostgreSQL pool of a worker at concurrency 1 or 2; more slots get one connection each plus two.
DEFAULT_POOL_SIZE = 4
#: The reaper runs this many times per threshold, so a dead process's row is reclaimed within
#: threshold + threshold / 5 of its last heartbeat.
REAPS_PER_THRESHOLD = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOptions:
    """How a worker runs.

    Attributes:
        idle_timeout: seconds without a job (none running, none claimed) after which it exits 0 (the
            command's ``--idle-timeout``, whose default is the one default).
        agent_id: the agent whose jobs it claims (default: ``AGENTLIFE_AGENT_ID``, else the class's).
        max_jobs: exit 0 after this many jobs (None: no limit).
        poll_interval: the first wait after finding no job; doubled while idle up to ``max_poll_interval``.
        max_poll_interval: the longest wait between two claims while idle.
        constants: use these instead of reading them from the environment.
        shell: what the process takes on: logs, signals, hard exit, probes (`ShellOptions`).
        concurrency: how many jobs run at once in the one event loop (``--concurrency``).
    """

    idle_timeout: float
    agent_id: str | None = None
    max_jobs: int | None = None
    poll_interval: float = 0.05
    max_poll_interval: float = 1.0
    constants: Constants | None = None
    shell: ShellOptions = field(default_factory=ShellOptions)
    concurrency: int = 1


def job_run(agent: AgentProcess, worker: Worker, store: JobStore, row: JobRecord) -> Runtime:
    """The lifecycle of one claimed job, with the worker's shell and store lent to it.

    Signals, the probe server, the telemetry and the hard exit stay with the worker; the job's journal,
    job heartbeat, LLM client and memory client are its own and are closed when it ends.
    """
    options = RunOptions(
        job_id=row.id,
        attempt=row.attempt,
        claimed=row,
        constants=worker.constants,
        # Signals, logs, the hard exit and the probes are the worker's.
        shell=ShellOptions(json_logs=False, handle_signals=False, hard_exit=False, probes=False),
    )
    mirror = worker.options.concurrency == 1  # one job at a time: the board's one-job fields name it
    return Runtime(
        agent, env=worker.env, options=options, shell=worker.shell, store=store, mirror_board=mirror
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
        #: The running limits per concurrency key and per agent every claim of this worker enforces.
        self.claim_limits = claim_limits_from_env(self.env)
        self.shell = ProcessShell(
            self.env,
            agent_id=self.agent_id,
            constants=self.constants,
            options=options.shell,
            on_signal=self.request_drain,
            log_context=self._log_context,
        )
        self.board, self.redactor = self.shell.board, self.shell.redactor
        self.drain = Drain(self.constants.drain.step_deadline_seconds)
        self.drain.add_listener(self._on_drain)
        #: The jobs running now, by job id.
        self.running: dict[str, Runtime] = {}
        self.jobs_done = 0
        self.jobs_crashed = 0
        #: Every job this process ran: (job id, attempt, exit code).
        self.history: list[tuple[str, int, int]] = []
        self._claimed = 0
        self._claim_lock: anyio.Lock | None = None  # one claim in flight per worker (see the module doc)
        self._wake: anyio.Event | None = None
        self._store_waiter = False  # an idle slot is asking the store for work: the others wait on _wake
        self._idle_since = time.monotonic()
        self._stop: tuple[int, str] | None = None

    @property
    def draining(self) -> bool:
        """True once SIGTERM (or `request_drain`) began the drain."""
        return self.drain.draining

    # -- the process ---------------------------------------------------------------------------------

    async def run(self) -> int:
        """Boot, take jobs until drained, idle or done, close everything; return the exit code."""
        self._wake = anyio.Event()
        self._claim_lock = anyio.Lock()
        self.drain.open()
        async with self.shell:
            code, reason = await self._serve()
            return self.shell.exit(code, reason, log)

    def request_drain(self, reason: str) -> None:
        """What SIGTERM does: drain every running job as ``run`` would, take no other, exit 143."""
        self.drain.request(reason)

    def _on_drain(self, reason: str) -> None:
        self.shell.arm_drain_exit()  # one grace period for every job: each gets the step deadline
        self.board.update_worker(state="draining")
        for job in list(self.running.values()):
            job.request_drain(reason)
        if self._wake is not None:
            self._wake.set()

    async def _serve(self) -> tuple[int, str]:
        self.board.update_worker(
            state="booting",
            jobs_done=0,
            jobs_crashed=0,
            current_job=None,
            runnable_jobs={},
            slots=self.options.concurrency,
            busy=0,
        )
        settings = Settings.from_env(
            self.env, job_id="worker", agent_id=self.agent_id, constants=self.constants
        )
        self.board.update(
            agent_id=self.agent_id,
            pod_name=settings.pod_name,
            blocked_threshold_seconds=self.constants.probe.blocked_threshold_seconds,
        )
        # Every slot may hold a connection at once, beside the reaper's and the gauge's. The slots' ones are
        # opened at boot: the first burst of jobs would otherwise start a session each on its way, every
        # one a few milliseconds of the server's time and of this loop's.
        slots = self.options.concurrency
        connections = max(DEFAULT_POOL_SIZE, slots + 2)
        store = store_from_url(settings.resolved_database_url, connections=connections, warm=slots)
        try:
            try:
                await store.open()
            except Exception as exc:  # a driver error no store code wrapped is still "unreachable"
                log.error("fatal: store unreachable: %s", self._why(exc))
                return ExitCode.CRASH, "store unreachable"
            try:
                # One query of the job table now: a database without the schema (or one older than job
                # operations) is a fatal boot error naming `db init`, not a claim that fails for ever.
                await store.count_runnable()
            except Exception as exc:
                log.error("fatal: the store cannot serve jobs: %s", self._why(exc))
                return ExitCode.CRASH, "store not usable"
            self.board.store_has_free_connection = store.has_free_connection
            self.shell.start_lag_monitor(self.constants.probe.lag_interval_seconds)
            self.shell.start_telemetry(settings, one_job=False)
            self.board.update(state=State.READY)
            log.info(
                "worker ready: taking jobs of agent %s",
                self.agent_id,
                extra=log_fields(
                    agent_id=self.agent_id, pid=os.getpid(), concurrency=self.options.concurrency
                ),
            )
            async with anyio.create_task_group() as duties:
                duties.start_soon(self._reap_periodically, store, settings.data_dir)
                duties.start_soon(self._count_periodically, store)
                result = await self._run_slots(store)
                duties.cancel_scope.cancel()
            return result
        finally:
            await self._close(store)

    async def _run_slots(self, store: WorkerStore) -> tuple[int, str]:
        self._show_slots()
        async with anyio.create_task_group() as slots:
            for _ in range(self.options.concurrency):
                slots.start_soon(self._slot, store)
        if self.drain.draining:
            return ExitCode.DRAINED, f"drained by {self.drain.reason} after {len(self.history)} jobs"
        assert self._stop is not None  # a slot returns only when draining or stopped
        return self._stop

    async def _slot(self, store: WorkerStore) -> None:
        """Claim and run jobs one after another until the drain, the idle timeout or ``max_jobs``.

        An error no path below foresaw ends this pass only: it is logged and the slot goes on after a
        pause, so one bad pass can neither take the pool down (its task group would end every slot) nor
        spin.
        """
        opts, delay = self.options, self.options.poll_interval
        # A store that notifies wakes the slot itself: the poll is only the fallback for a lost notification.
        cap = (
            max(opts.max_poll_interval, NOTIFY_FALLBACK_POLL_SECONDS)
            if store.notifies
            else opts.max_poll_interval
        )
        while not (self.drain.draining or self._stop):
            try:
                delay = await self._slot_pass(store, delay, cap)
            except Exception as exc:
                log.error("worker slot: internal error: %s", self._why(exc), exc_info=exc)
                delay = opts.max_poll_interval
                await anyio.sleep(delay)

    async def _slot_pass(self, store: WorkerStore, delay: float, cap: float) -> float:
        """Claim one job and run it, or wait for work; the next wait's length."""
        opts = self.options
        row = await self._claim(store)
        if row is None:
            if self.drain.draining or self._stop:
                return delay
            if await self._wait_for_work(store, delay):
                return opts.poll_interval  # a sign of work: claim at once, and poll briskly after
            return min(delay * 2, cap)
        self._wake_idle_slots()  # there may be more: idle slots try too
        # The job's boot runs on the loop without awaiting for a while: let the next slot's claim go out
        # first, so its round trip overlaps this boot instead of following it.
        await anyio.lowlevel.cancel_shielded_checkpoint()  # no cancel point: the row is claimed
        await self._run_job(store, row)
        return opts.poll_interval

    def _stop_all(self, code: int, reason: str) -> None:
        if self._stop is None:
            self._stop = (code, reason)
        self._wake_idle_slots()

    async def _wait_for_work(self, store: WorkQueue, seconds: float) -> bool:
        """Until the store signals work for this agent, a wake-up (reaper, drain, claim), or ``seconds``.

        One idle slot asks the store and the others wait for it: the store sees one waiter per worker.
        The slot that asks also keeps the idle timeout (no job running for that long ends the worker).
        """
        wake = self._wake
        assert wake is not None
        if self._store_waiter:
            with anyio.move_on_after(max(seconds, self.options.max_poll_interval) * 4):
                await wake.wait()
                return True
            return False
        idle = time.monotonic() - self._idle_since if not self.running else 0.0
        if idle >= self.options.idle_timeout:
            self._stop_all(
                ExitCode.DONE, f"idle for {idle:.1f}s (--idle-timeout {self.options.idle_timeout:g})"
            )
            return False
        seconds = min(seconds, self.options.idle_timeout - idle)
        woken = False

        async def store_signal() -> None:
            nonlocal woken
            try:
                woken = await store.wait_for_work(self.agent_id, seconds)
            except Exception as exc:  # no notifications this time: the wait ends at its deadline (a poll)
                log.warning("waiting for work: %s", self._why(exc))
                self.board.update_worker(claim_error=self._why(exc))
                await anyio.sleep_forever()
            scope.cancel()

        async def wake_event() -> None:
            nonlocal woken
            await wake.wait()
            woken = True
            scope.cancel()

        self._store_waiter = True
        try:
            with anyio.move_on_after(seconds) as scope:
                async with anyio.create_task_group() as waits:
                    waits.start_soon(store_signal)
                    waits.start_soon(wake_event)
        finally:
            self._store_waiter = False
        if woken:
            self._wake_idle_slots()
        return woken

    def _wake_idle_slots(self) -> None:
        """Wake every slot waiting for work (the drain's event stays set: no slot waits after it)."""
        if self._wake is not None and not self._wake.is_set():
            self._wake.set()
            if not self.drain.draining:
                self._wake = anyio.Event()

    async def _claim(self, store: WorkQueue) -> JobRecord | None:
        """The next job, or None; one claim of this worker at a time (see the module docstring).

        A slot waiting for its turn gives way to the drain at once; once its turn comes, a drain, a stop or
        ``max_jobs`` reached meanwhile means no claim. A failed claim makes the worker unready until a claim
        works again.
        """
        lock = self._claim_lock
        assert lock is not None
        with anyio.CancelScope() as turn, self.drain.cancelled(turn):
            await lock.acquire()
        if turn.cancelled_caught:
            return None
        try:
            return await self._claim_now(store)
        finally:
            lock.release()

    async def _claim_now(self, store: WorkQueue) -> JobRecord | None:
        opts = self.options
        if self.drain.draining or self._stop:
            return None
        if opts.max_jobs is not None and self._claimed >= opts.max_jobs:
            self._stop_all(ExitCode.DONE, f"ran {opts.max_jobs} jobs (--max-jobs)")
            return None
        try:
            row = await store.claim_next(self.agent_id, limits=self.claim_limits)
        except Exception as exc:  # an outage, or a row no store code foresaw: the pool goes on either way
            why = self._why(exc)
            log.warning("claim failed: %s", why)
            self.board.update_worker(claim_error=why)
            return None
        self.board.update_worker(claim_error=None)
        if row is not None:
            self._claimed += 1
        return row

    async def _run_job(self, store: WorkerStore, row: JobRecord) -> None:
        if self.drain.draining:  # the signal came while the claim ran: the row goes straight back
            await self._hand_back(store, row, "claimed during the drain")
            return
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
            await self._after_crash(store, row, "AgentInitFailed", describe_error(exc))
            return
        job = self.running[row.id] = job_run(agent, self, store, row)
        self._show_slots()  # no await since the drain check: a drain from now on reaches it in `running`
        # A job the engine did not record a crash for is recorded by `_after_crash` as this error class.
        error_class = "BootFailure"
        try:
            code, reason = await job.run(), job.exit_reason or "the job failed before its first step"
        except Exception as exc:  # the engine failed around the job: a crash of that job, not of the pool
            error_class, reason, code = "InternalError", f"internal error: {self._why(exc)}", ExitCode.CRASH
            log.error("job %s: %s", row.id, reason, exc_info=exc, extra=log_fields(job_id=row.id))
        finally:
            del self.running[row.id]
            self._idle_since = time.monotonic()
            self._show_slots()
        self._log_job_end(row, code, reason)
        self.history.append((row.id, row.attempt, code))
        await self._drop_claim(store, row)
        if code == ExitCode.DRAINED:
            await self._hand_back(store, row, "drained")
        elif code == ExitCode.DONE:
            self.jobs_done += 1
        else:
            self.jobs_crashed += 1
            await self._after_crash(store, row, error_class, reason)
        if self.options.concurrency == 1:
            self.board.update(state=State.READY, job_id="", attempt=0, step=None)
        self.board.update_worker(jobs_done=self.jobs_done, jobs_crashed=self.jobs_crashed)

    def _show_slots(self) -> None:
        """``/status`` and ``/readyz``: idle (ready) while a slot is free, busy when all are taken."""
        busy, slots = len(self.running), self.options.concurrency
        state = "draining" if self.drain.draining else ("busy" if busy >= slots else "idle")
        current = next(iter(self.running), None) if slots == 1 else None
        self.board.update_worker(state=state, busy=busy, current_job=current, jobs=sorted(self.running))
        if slots == 1 and current is not None:
            self.board.update_worker(attempt=self.running[current].options.attempt)

    def _log_job_end(self, row: JobRecord, code: int, reason: str) -> None:
        # The process goes on: "exit 0" here would read as the worker's own exit.
        ended = JOB_OUTCOMES.get(code, "crashed")
        log.info(
            "job %s attempt %s %s: %s",
            row.id,
            row.attempt,
            ended,
            reason,
            extra=log_fields(
                event="job_ended", job_id=row.id, attempt=row.attempt, outcome=ended, reason=reason
            ),
        )

    async def _drop_claim(self, store: Handback, row: JobRecord) -> None:
        """This worker goes on without the job: a job it parked for approval must not look attended."""
        with anyio.CancelScope(shield=True):
            try:
                await store.drop_claim(row.id)
            except Exception as exc:
                log.warning("could not drop the claim on job %s: %s", row.id, self._why(exc))

    async def _hand_back(self, store: Handback, row: JobRecord, why: str) -> None:
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
            except Exception as exc:
                log.warning("could not hand job %s back (the reaper will): %s", row.id, self._why(exc))

    async def _after_crash(self, store: JobStore, row: JobRecord, error_class: str, why: str) -> None:
        """The crash is on the row (as ``run`` records it); its retry is decided now, not by the reaper.

        `should_retry_after_crash` on the row's crash history: RETRYING after the backoff schedule's delay
        (5 s, 60 s, 300 s, 1800 s), or DEAD_LETTER / FAILED. A crash the engine did not record (the agent
        class could not be built, ``AgentInitFailed``; the job's boot failed, ``BootFailure``: a job id no
        path may hold, a conversation that does not verify; the engine itself failed around the job,
        ``InternalError``) is recorded here first as ``error_class`` and ``why``, so the policy counts it
        like any other.
        """
        with anyio.CancelScope(shield=True):
            try:
                current = await store.get_job(row.id)
                if current is None or current.status != JobStatus.RUNNING or current.attempt != row.attempt:
                    return
                if not any(is_crash(e) and e.get("attempt") == row.attempt for e in current.error):
                    current = await self._record_crash(store, row, error_class, why)
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
            except Exception as exc:  # the reaper settles it once the heartbeat stops
                log.warning("could not settle crashed job %s: %s", row.id, self._why(exc))

    async def _record_crash(
        self, store: JobStore, row: JobRecord, error_class: str, why: str
    ) -> JobRecord | None:
        """Append the crash record the engine could not write; the row as it is then."""
        error: dict[str, Any] = {"at": time.time(), "attempt": row.attempt, "exit_code": ExitCode.CRASH}
        error.update(error_class=error_class, message=self.redactor.redact(why))
        await store.set_status(
            row.id, row.attempt, JobStatus.RUNNING, error=error, expect=(JobStatus.RUNNING,)
        )
        return await store.get_job(row.id)

    # -- background duties ---------------------------------------------------------------------------

    async def _reap_periodically(self, store: CheckpointStore, data_dir: Path) -> None:
        """The zombie reaper: RUNNING rows whose heartbeat stopped go back to RETRYING (or dead letter).

        Rows whose claiming process ran in this pid namespace and has exited are reaped as soon as their
        heartbeat is one job heartbeat interval old (a fresh heartbeat always wins), not after the
        threshold: the first pass runs at boot and the passes come at least once per heartbeat interval,
        so a worker container restarted in place (OOM-killed, crashed) takes its predecessor's job back
        within about one interval plus the first backoff step. Every `RETENTION_PERIOD_SECONDS` the pass
        also applies retention (`apply_retention`): finished jobs past their period (``AGENTLIFE_RETAIN_*``,
        none unless set) are pruned, old tombstones deleted, and the journals of pruned jobs removed from
        this pod's data directory.
        """
        heartbeat = self.constants.heartbeat
        threshold = heartbeat.zombie_after_seconds
        period = min(threshold / REAPS_PER_THRESHOLD, heartbeat.job_interval_seconds)

        retained_at = -math.inf

        async def reap() -> None:
            nonlocal retained_at
            decisions = await store.reap(threshold, constants=self.constants, dead_owners=True)
            for d in decisions:
                _log_reaped(d)
            if decisions:
                self._wake_idle_slots()  # a reaped row may be runnable at once
            # The retention policy rides on the reaper's pass (and its connection), less often.
            # Without a period too: tombstones expire and the journals of jobs pruned by hand still go.
            if time.monotonic() - retained_at >= RETENTION_PERIOD_SECONDS:
                retained_at = time.monotonic()
                await apply_retention(store, self.constants.retention, data_dir)

        await self._every(period, "reaper", reap)

    async def _count_periodically(self, store: WorkQueue) -> None:
        """Refresh the ``agentlife_runnable_jobs`` gauge (counted here, never on the probe thread)."""

        async def count() -> None:
            counts = await store.count_runnable()
            self.board.update_worker(runnable_jobs={self.agent_id: 0, **counts}, counted_at=time.time())

        await self._every(self.constants.probe.readiness_period_seconds, "counting runnable jobs", count)

    async def _every(self, period: float, what: str, duty: Callable[[], Awaitable[None]]) -> None:
        """Run ``duty`` now and every ``period`` seconds; its failure is one redacted line, never the end.

        A background duty raising out of its task would end the duties' task group and with it the
        worker (an ``ExceptionGroup`` at the top, exit 1): an outage, a row no store code foresaw or a bug
        in the duty must only skip one pass.
        """
        while True:
            try:
                await duty()
            except Exception as exc:
                log.warning("%s: %s", what, self._why(exc))
            await anyio.sleep(period)

    def _why(self, exc: BaseException) -> str:
        """``Type: message`` of an error, redacted, on one line (a group by its leaves)."""
        return describe_error(exc, redact=self.redactor.redact)

    # -- process services ----------------------------------------------------------------------------

    async def _close(self, store: JobRows) -> None:
        self.board.update_worker(state="stopping", current_job=None)
        budget = self.constants.drain.cleanup_budget_seconds
        with anyio.move_on_after(budget, shield=True):
            await quietly("store close", store.close())
        self.board.update(state=State.TERMINATED)

    def _log_context(self) -> dict[str, Any]:
        # The worker's own lines name no job; a job's lines carry its fields (bound in its task).
        snap = self.board.snapshot()
        return {
            "job_id": None,
            "agent_id": snap.agent_id or None,
            "attempt": None,
            "state": snap.state.value,
            "step": None,
        }


def _log_reaped(d: ReapDecision) -> None:
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
