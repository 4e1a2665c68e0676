"""A stand-in for `Telemetry` until the OpenTelemetry SDK has been imported off the boot path.

The SDK's imports (~45 ms of CPU, more on a busy node) would compete with boot and with the first model
request for the GIL. Until the real `Telemetry` is attached, what happens is buffered and replayed into it,
so no transition, hydration timing or first-step measurement is lost. When it is built:

* with an exporter configured (``OTEL_METRICS_EXPORTER`` / ``OTEL_TRACES_EXPORTER``), on a thread as soon as
  the process is READY, so its spans and periodic exports cover the whole job;
* without one (the default: Prometheus scrapes ``/metrics``), only once something needs it: the first
  ``/metrics`` scrape, which waits for the build (bounded) so it answers with the job's metrics, at
  TERMINATED too, or a buffer of `BUILD_AFTER_RECORDS` records (a long job nobody scrapes yet). Nothing is
  exported, so the spans before it, which nothing would receive, are not missed; a short job nobody scrapes
  never pays for the SDK (~85 ms of CPU a process).

A process drained before READY never builds it: its probes still serve the core gauges.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from agentlife._observe._telemetry_export import exporters_configured

if TYPE_CHECKING:
    from agentlife._config import Settings
    from agentlife._llm._protocol import LLMReply, Usage
    from agentlife._observe._status import StatusBoard
    from agentlife._observe._telemetry import Telemetry
    from agentlife._state import Transition

__all__ = ["BUILD_AFTER_RECORDS", "SCRAPE_WAIT_SECONDS", "TelemetryFacade"]

log = logging.getLogger("agentlife.telemetry")

#: Records buffered before a deferred build starts anyway (a long first step must not grow the buffer).
BUILD_AFTER_RECORDS = 256
#: How long a ``/metrics`` scrape waits for the build; past it, the probe serves its core gauges.
SCRAPE_WAIT_SECONDS = 5.0


class _NullSpan:
    def record_error(self, exc: BaseException) -> None:
        pass

    def record_reply(self, reply: LLMReply) -> None:
        pass


class TelemetryFacade:
    """Forwards to the real `Telemetry` once attached; buffers until then."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._telemetry: Telemetry | None = None
        self._pending: list[tuple[contextvars.Context, Callable[[Telemetry], object]]] = []
        self._build: Callable[[], None] | None = None
        self._thread: threading.Thread | None = None
        self._eager = False
        self._disabled = False

    @property
    def telemetry(self) -> Telemetry | None:
        """The real telemetry, once built."""
        return self._telemetry

    def start_building(
        self, settings: Settings, board: StatusBoard, env: dict[str, str], *, one_job: bool = True
    ) -> None:
        """Build `Telemetry` on a daemon thread now (an exporter is configured) or when first needed.

        Once per process: the jobs of a worker share the telemetry it built. ``one_job``: the process runs
        one job, whose id and attempt are resource attributes; a worker's resource names no job (each span
        and measurement names its own, see `agentlife._logging.job_attributes`).
        """
        if self._build is not None:
            return

        def build() -> None:
            try:
                from agentlife._observe._telemetry import Telemetry

                attributes: dict[str, object] = {
                    "agent.id": settings.agent_id,
                    "k8s.pod.name": settings.pod_name,
                }
                if one_job:
                    attributes.update({"job.id": settings.job_id, "job.attempt": settings.attempt})
                telemetry = Telemetry(
                    env.get("OTEL_SERVICE_NAME") or f"agentlife-{settings.agent_id}", attributes, env=env
                )
            except Exception as exc:
                log.warning("telemetry disabled: %s: %s", type(exc).__name__, exc)
                with self._lock:
                    self._disabled, self._pending = True, []
                return
            self._attach(telemetry)
            telemetry.follow_board(board)
            board.metrics_text = telemetry.prometheus_text
            board.metrics_ready = None

        self._build = build
        self._eager = exporters_configured(env)
        if self._eager:
            self._start_build()
        else:
            board.metrics_text = self._metrics_text
            board.metrics_ready = self._wait_built

    def _start_build(self) -> threading.Thread | None:
        """The build's thread, started by the first caller (loop or probe thread); None before READY."""
        with self._lock:
            if self._thread is None and self._build is not None:
                self._thread = threading.Thread(target=self._build, name="agentlife-telemetry", daemon=True)
                self._thread.start()
            return self._thread

    def _wait_built(self) -> None:
        """Start the deferred build and wait for it, at most `SCRAPE_WAIT_SECONDS` (a ``/metrics`` scrape)."""
        thread = self._start_build()
        if thread is not None and thread is not threading.current_thread():
            thread.join(SCRAPE_WAIT_SECONDS)

    def _metrics_text(self) -> str | None:
        """``/metrics`` before the build is attached: None (the core gauges), and the build started."""
        telemetry = self._telemetry
        if telemetry is None:
            self._start_build()
            return None
        return telemetry.prometheus_text()

    def _attach(self, telemetry: Telemetry) -> None:
        # Replayed in order, and attached only once the buffer is empty under the lock: a record made while
        # the replay runs joins the buffer behind the older ones, so a late transition is never overwritten
        # by an earlier one replayed after it.
        while True:
            with self._lock:
                pending, self._pending = self._pending, []
                if not pending:
                    self._telemetry = telemetry
                    return
            for context, record in pending:
                # In the context it was recorded in: the job it belongs to, not the builder thread's.
                context.run(self._safely, record, telemetry)

    def _record(self, fn: Callable[[Telemetry], object]) -> None:
        with self._lock:
            telemetry = self._telemetry
            if telemetry is None and not self._disabled:
                self._pending.append((contextvars.copy_context(), fn))
            buffered = len(self._pending)
        if telemetry is None:
            if buffered >= BUILD_AFTER_RECORDS:
                self._start_build()
            return
        self._safely(fn, telemetry)

    @staticmethod
    def _safely(fn: Callable[[Telemetry], object], telemetry: Telemetry) -> None:
        try:
            fn(telemetry)
        except Exception as exc:  # telemetry must never break the agent
            log.debug("telemetry record failed: %s", exc)

    # -- recorders --------------------------------------------------------------------------------------

    def record_transition(self, transition: Transition) -> None:
        self._record(lambda t: t.record_transition(transition))

    def hydration_phase(self, phase: str, seconds: float) -> None:
        self._record(lambda t: t.hydration_phase(phase, seconds))

    def step_completed(self, seconds: float) -> None:
        self._record(lambda t: t.step_completed(seconds))

    def llm_call(self, model: str, outcome: str, usage: Usage | None) -> None:
        self._record(lambda t: t.llm_call(model, outcome, usage))

    def rate_limit_wait(self, bucket: str, reason: str, seconds: float) -> None:
        self._record(lambda t: t.rate_limit_wait(bucket, reason, seconds))

    def tool_call(self, name: str, outcome: str, seconds: float) -> None:
        self._record(lambda t: t.tool_call(name, outcome, seconds))

    def drain(self, reason: str, seconds: float) -> None:
        self._record(lambda t: t.drain(reason, seconds))

    def bootstrap_done(self, data_dir: str | None = None, job_id: str | None = None) -> None:
        """Spawn -> first tool dispatch, measured from the kernel's process start time."""
        from agentlife._observe._telemetry import bootstrap_kind

        kind = bootstrap_kind(data_dir=data_dir, job_id=job_id)
        self._record(lambda t: t.bootstrap(kind))

    def execution(self, seconds: float) -> None:
        self._record(lambda t: t.execution(seconds))

    # -- spans: only once attached (a span that started before cannot be replayed) ------------------------

    @contextmanager
    def step_span(self, step: int) -> Iterator[None]:
        telemetry = self._telemetry
        if telemetry is None:
            yield
            return
        with telemetry.step_span(step):
            yield

    @contextmanager
    def llm_span(self, model: str, *, max_tokens: int, system: str) -> Iterator[Any]:
        telemetry = self._telemetry
        if telemetry is None:
            yield _NullSpan()
            return
        with telemetry.llm_span(model, max_tokens=max_tokens, system=system) as span:
            yield span

    @contextmanager
    def tool_span(self, name: str, invocation_id: str) -> Iterator[None]:
        telemetry = self._telemetry
        if telemetry is None:
            yield
            return
        with telemetry.tool_span(name, invocation_id):
            yield

    async def ashutdown(self, timeout: float) -> None:
        """Flush exporters without blocking the loop (an OTLP export can take seconds).

        With an exporter, a build still in flight is waited for (bounded): a short job's data is flushed,
        not dropped. Without one there is nothing to flush, and a later scrape builds what it renders.
        """
        thread = self._thread
        if self._eager and thread is not None and thread.is_alive():
            import anyio.to_thread

            await anyio.to_thread.run_sync(thread.join, timeout, abandon_on_cancel=True)
        telemetry = self._telemetry
        if telemetry is not None:
            try:
                await telemetry.ashutdown(timeout)
            except Exception as exc:
                log.debug("telemetry shutdown failed: %s", exc)
