"""A stand-in for `Telemetry` until the OpenTelemetry SDK has been imported off the boot path.

The SDK's imports (~120 ms) would compete with boot for the GIL, so the real `Telemetry` is built on a
thread once the process is READY. Until it is attached, what happens is buffered and replayed into it, so
no transition or hydration timing is lost. (A process drained before READY never builds it: its probes
still serve the core gauges.)
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentlife._config import Settings
    from agentlife._llm._protocol import LLMReply, Usage
    from agentlife._observe._status import StatusBoard
    from agentlife._observe._telemetry import Telemetry
    from agentlife._state import Transition

__all__ = ["TelemetryFacade"]

log = logging.getLogger("agentlife.telemetry")


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
        self._thread: threading.Thread | None = None

    @property
    def telemetry(self) -> Telemetry | None:
        """The real telemetry, once built."""
        return self._telemetry

    def start_building(
        self, settings: Settings, board: StatusBoard, env: dict[str, str], *, one_job: bool = True
    ) -> None:
        """Build `Telemetry` on a daemon thread and attach it when done.

        Once per process: the jobs of a worker share the telemetry it built at boot. ``one_job``: the
        process runs one job, whose id and attempt are resource attributes; a worker's resource names no
        job (each span and measurement names its own, see `agentlife._logging.job_attributes`).
        """
        if self._thread is not None:
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
                return
            self._attach(telemetry)
            telemetry.follow_board(board)
            board.metrics_text = telemetry.prometheus_text

        self._thread = threading.Thread(target=build, name="agentlife-telemetry", daemon=True)
        self._thread.start()

    def _attach(self, telemetry: Telemetry) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            self._telemetry = telemetry
        for context, record in pending:
            # Replayed in the context it was recorded in: the job it belongs to, not the builder thread's.
            context.run(self._safely, record, telemetry)

    def _record(self, fn: Callable[[Telemetry], object]) -> None:
        with self._lock:
            telemetry = self._telemetry
            if telemetry is None:
                self._pending.append((contextvars.copy_context(), fn))
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
        """Flush exporters without blocking the loop (an OTLP export can take seconds)."""
        telemetry = self._telemetry
        if telemetry is not None:
            try:
                await telemetry.ashutdown(timeout)
            except Exception as exc:
                log.debug("telemetry shutdown failed: %s", exc)
