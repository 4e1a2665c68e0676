"""The process around the jobs, shared by ``run`` (one job) and ``worker`` (many): `ProcessShell`.

It owns what lives as long as the process, each entered on one exit stack and closed in reverse order:
the JSON logs, the probe server and its `StatusBoard`, the signal receiver and the `HardExit`, the lag
monitor and the telemetry facade. A job borrows the board, the telemetry and the redactor; nothing a job
does changes a process-wide setting (each job's log fields, span attributes and ``/status`` entry are its
own, see `agentlife._logging.job_log_context`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread

from agentlife._config import probe_address
from agentlife._exceptions import ConfigError
from agentlife._exitcode import ExitCode
from agentlife._llm._ratelimiter import RateLimiter
from agentlife._logging import log_fields, process_logging
from agentlife._observe._lag import run_lag_monitor
from agentlife._observe._status import StatusBoard
from agentlife._observe._telemetry_facade import TelemetryFacade
from agentlife._redact import Redactor
from agentlife._runtime._signals import EarlySignal, HardExit, receive_drain_signals
from agentlife.constants import Constants

if TYPE_CHECKING:
    from agentlife._config import Settings
    from agentlife.stores import JobStore

__all__ = ["ProcessShell", "ShellOptions", "quietly"]

log = logging.getLogger("agentlife.runtime")


@dataclass(frozen=True, slots=True)
class ShellOptions:
    """What the process takes on; the CLI takes everything, an in-process run little.

    `RunOptions` and `WorkerOptions` each hold one, as ``shell``: a job run and a worker are the same
    process to the shell.

    Attributes:
        json_logs: route logging through the JSON handler.
        handle_signals: install the SIGTERM/SIGINT receiver (main thread only).
        hard_exit: ``os._exit`` when the drain overruns its budget, even if code ignoring cancellation
            still runs.
        probes: start the probe server.
        log_stream: where JSON logs go (default stdout).
        early_signal: a signal caught before the runtime started, while the agent's class was imported
            (see `EarlySignal`).
    """

    json_logs: bool = True
    handle_signals: bool = True
    hard_exit: bool = True
    probes: bool = True
    log_stream: Any = None
    early_signal: EarlySignal | None = None


def constants_or_default(env: Mapping[str, str]) -> Constants:
    """The environment's constants, or the defaults when one is bad (the settings report it at boot)."""
    try:
        return Constants.from_env(env)
    except ConfigError:
        return Constants()


class ProcessShell:
    """Logs, signals and hard exit, probes and status board, telemetry, lag monitor: one exit stack.

    Args:
        env: the process environment (``AGENTLIFE_HEALTH_*``, ``AGENTLIFE_LOG_LEVEL``, secrets to mask).
        agent_id: the agent this process runs, for the board.
        constants: the drain and probe budgets.
        options: see `ShellOptions`.
        on_signal: what SIGTERM/SIGINT do (the drain's ``request``).
        log_context: the process's own log fields (a job's fields are added in its task).
    """

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        agent_id: str,
        constants: Constants,
        options: ShellOptions,
        on_signal: Callable[[str], None],
        log_context: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.env = env
        self.constants = constants
        self.options = options
        self.redactor = Redactor.from_env(env)
        self.board = StatusBoard(job_id="", agent_id=agent_id, attempt=0)
        self.telemetry = TelemetryFacade()
        self.hard_exit = HardExit(enabled=options.hard_exit)
        self._on_signal = on_signal
        self._log_context = log_context
        self._stack = contextlib.AsyncExitStack()
        self._tasks: anyio.abc.TaskGroup | None = None
        self._probe_server: Any = None
        self._lag_started = False
        self._limiter: RateLimiter | None = None

    def rate_limiter(self, store: JobStore, settings: Settings) -> RateLimiter | None:
        """The process's rate limiter, shared by every job it runs; None when no limit is configured.

        Made on first use, over the first job's store (a worker lends one store to all its jobs).
        """
        if settings.rate_limits is None:
            return None
        if self._limiter is None:
            calls = settings.constants.calls
            limiter = RateLimiter(
                store,  # type: ignore[arg-type]  # every store is also RateBuckets (CheckpointStore)
                settings.rate_limits,
                slot_lease_seconds=calls.rate_limit_slot_lease_seconds,
                store_down_seconds=calls.rate_limit_store_down_seconds,
            )
            board, telemetry = self.board, self.telemetry

            def observe(bucket: str, reason: str, seconds: float | None) -> None:
                if seconds is not None:
                    telemetry.rate_limit_wait(bucket, reason, seconds)
                board.update(rate_limits=limiter.snapshot())

            limiter.observe = observe
            limiter.changed = lambda: board.update(rate_limits=limiter.snapshot())
            board.update(rate_limits=limiter.snapshot())
            self._limiter = limiter
        return self._limiter

    # -- entering and leaving ------------------------------------------------------------------------

    async def __aenter__(self) -> ProcessShell:
        stack = self._stack
        stack.enter_context(
            process_logging(
                self.env,
                enabled=self.options.json_logs,
                context=self._log_context,
                redactor=self.redactor,
                stream=self.options.log_stream,
            )
        )
        stack.push(self._disarm_on_error)
        self._tasks = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(self._tasks.cancel_scope.cancel)  # runs first on the way out: no task outlives us
        stack.push_async_callback(self._shut_down)
        if self.options.handle_signals:
            await self._tasks.start(self._receive_signals)
        self._start_probe_server()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._stack.__aexit__(exc_type, exc, tb)

    def _disarm_on_error(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            self.hard_exit.disarm()

    async def _shut_down(self) -> None:
        """Telemetry flushed, then the probe server stopped, each bounded: the job's work is settled."""
        budget = self.constants.drain.cleanup_budget_seconds
        with anyio.move_on_after(min(2.0, budget), shield=True):
            await quietly("telemetry shutdown", self.telemetry.ashutdown(min(2.0, budget)))
        if self._probe_server is not None:
            with anyio.CancelScope(shield=True):
                await quietly("probe server stop", anyio.to_thread.run_sync(self._probe_server.stop))

    # -- the services --------------------------------------------------------------------------------

    def start_lag_monitor(self, interval: float) -> None:
        """Sample the loop's lag onto the board (once per process, whoever asks first)."""
        if not self._lag_started and self._tasks is not None:
            self._lag_started = True
            self._tasks.start_soon(run_lag_monitor, self.board, interval)

    def start_telemetry(self, settings: Settings, *, one_job: bool) -> None:
        """Build the real telemetry off the boot path (once per process)."""
        self.telemetry.start_building(settings, self.board, dict(self.env), one_job=one_job)

    def arm_hard_exit(self, seconds: float, code: int) -> None:
        """Exit with ``code`` if the process is still here after ``seconds`` plus half the SIGKILL buffer."""
        margin = min(self.constants.drain.sigkill_buffer_seconds / 2, 2.0)
        self.hard_exit.arm(seconds + margin, code)

    def arm_drain_exit(self) -> None:
        """A drain began: the process is out within the step deadline and cleanup budget, whatever runs."""
        drain = self.constants.drain
        self.arm_hard_exit(drain.step_deadline_seconds + drain.cleanup_budget_seconds, ExitCode.DRAINED)

    def exit(self, code: int, reason: str, logger: logging.Logger = log) -> int:
        """Settle the exit code (a swallowed cancel cannot hold the process) and log the exit line."""
        self.hard_exit.settle(self.constants.drain.cleanup_budget_seconds, code)
        logger.info("exit %s: %s", code, reason, extra=log_fields(exit_code=code, reason=reason))
        return int(code)

    def _start_probe_server(self) -> None:
        if not self.options.probes:
            return
        address = probe_address(self.env)
        if address is None:
            return
        from agentlife._observe._probes import ProbeServer

        self._probe_server = ProbeServer(
            self.board,
            *address,
            blocked_threshold=self.constants.probe.blocked_threshold_seconds,
            redactor=self.redactor,
        )
        self._probe_server.start()

    def _receive_signals(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> Any:
        return receive_drain_signals(
            self._on_signal,
            early=self.options.early_signal,
            on_signal_off_loop=self.arm_drain_exit,
            task_status=task_status,
        )


async def quietly(what: str, awaitable: Any) -> None:
    """Await a cleanup step; its failure is one log line, and the settled exit code stands."""
    try:
        await awaitable
    except Exception as exc:
        log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)
