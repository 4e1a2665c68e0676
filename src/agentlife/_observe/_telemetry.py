"""OpenTelemetry metrics and spans of one agent process, and the bootstrap tax.

`Telemetry` owns an SDK `MeterProvider` and `TracerProvider`, the instruments of an agent process and record
methods with telling names for the runtime to call. ``/metrics`` is rendered by `Telemetry.prometheus_text`
from an in-memory reader, so Prometheus scraping needs no exporter; OTLP and console exporters are added only
when the standard ``OTEL_METRICS_EXPORTER`` / ``OTEL_TRACES_EXPORTER`` variables ask for them.

The OpenTelemetry SDK (and the OTLP exporter, when configured) is imported inside `Telemetry`, never at
module level: the runtime builds `Telemetry` on a background thread during boot, so the import overlaps
store connection and hydration instead of delaying READY. `process_start_time` and `bootstrap_kind` are
plain stdlib and cheap.

Example:
    >>> t = Telemetry("reviewer", {"agent.id": "reviewer"}, env={})
    >>> t.step_completed(0.25)
    >>> "agent_steps_completed_total 1" in t.prometheus_text()
    True
    >>> t.shutdown()
    True
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentlife._logging import JOB_ATTRIBUTES
from agentlife._observe._prometheus import labels, render_family
from agentlife._observe._telemetry_export import meter_provider, resource_attributes
from agentlife._observe._telemetry_export import metric_readers as env_metric_readers
from agentlife._observe._telemetry_export import span_processors as env_span_processors
from agentlife._state import State, Transition

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, CallbackT, Meter, Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Span

    from agentlife._observe._status import StatusBoard

__all__ = [
    "HYDRATION_PHASES",
    "INSTRUMENTS",
    "InstrumentSpec",
    "LlmSpan",
    "Telemetry",
    "bootstrap_kind",
    "process_start_time",
]

_log = logging.getLogger("agentlife.telemetry")

#: Values of the ``phase`` attribute of ``agent.hydration.duration``: the three steps of hydration, and
#: ``claim`` (taking ownership of the job row before the checkpoint load), which the runtime times too.
HYDRATION_PHASES = ("claim", "checkpoint", "journal_scan", "memory")

StartKind = Literal["cold", "warm"]

_STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_BOOT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0)
_RUN_BUCKETS = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0)


@dataclass(frozen=True, slots=True)
class InstrumentSpec:
    """One instrument: OpenTelemetry name, kind, UCUM unit, description, attribute keys."""

    name: str
    kind: Literal["counter", "gauge", "histogram"]
    unit: str
    description: str
    attributes: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None


#: Every instrument `Telemetry` creates, in ``/metrics`` order.
INSTRUMENTS: tuple[InstrumentSpec, ...] = (
    InstrumentSpec(
        "agent.lifecycle.state",
        "gauge",
        "{state}",
        "1 for the current lifecycle state, 0 for the others",
        ("state",),
    ),
    InstrumentSpec("agent.steps.completed", "counter", "{step}", "Steps completed by this process"),
    InstrumentSpec(
        "agent.step.duration", "histogram", "s", "Wall time of one completed step", (), _STEP_BUCKETS
    ),
    InstrumentSpec(
        "agent.llm.calls", "counter", "{call}", "LLM calls by model and outcome", ("model", "outcome")
    ),
    InstrumentSpec(
        "agent.llm.tokens", "counter", "{token}", "LLM tokens by model and type", ("model", "type")
    ),
    InstrumentSpec(
        "agent.tool.calls", "counter", "{call}", "Tool calls by tool and outcome", ("tool", "outcome")
    ),
    InstrumentSpec(
        "agent.llm.rate_limit.wait",
        "histogram",
        "s",
        "Time a model call waited for fleet-wide rate-limit capacity, by bucket",
        ("bucket", "reason"),
        _STEP_BUCKETS,
    ),
    InstrumentSpec(
        "agent.tool.duration",
        "histogram",
        "s",
        "Wall time of one tool call",
        ("tool", "outcome"),
        _STEP_BUCKETS,
    ),
    InstrumentSpec("agent.drains", "counter", "{drain}", "Drains by reason", ("reason",)),
    InstrumentSpec(
        "agent.drain.duration", "histogram", "s", "Drain start to cleanup done", ("reason",), _STEP_BUCKETS
    ),
    InstrumentSpec("agent.event_loop.lag", "gauge", "s", "Drift of the event loop lag sampler"),
    InstrumentSpec(
        "agent.hydration.duration",
        "histogram",
        "s",
        "Duration of one hydration phase",
        ("phase",),
        _STEP_BUCKETS,
    ),
    InstrumentSpec(
        "agent.bootstrap_seconds",
        "histogram",
        "s",
        "Kernel process start to first tool dispatch (the bootstrap tax)",
        ("start",),
        _BOOT_BUCKETS,
    ),
    InstrumentSpec(
        "agent.execution_seconds", "histogram", "s", "Time spent executing the job", (), _RUN_BUCKETS
    ),
)

# OpenTelemetry UCUM units -> Prometheus base-unit suffixes (the OTel-to-Prometheus compatibility spec).

# The fallback start time when the kernel cannot tell: as early as this module can see.
_IMPORTED_AT = time.time()


# -- process start and the bootstrap tax ----------------------------------------------------------------


def process_start_time() -> float:
    """Unix time at which the kernel started this process, so interpreter start and imports count.

    On Linux: ``/proc/self/stat`` field 22 (start time in clock ticks since boot, ``SC_CLK_TCK`` per second)
    against ``CLOCK_BOOTTIME`` now, which is exact to one tick (10 ms); without ``CLOCK_BOOTTIME`` the boot
    time ``btime`` of ``/proc/stat`` is used (whole seconds). Elsewhere: the time this module was imported,
    which undercounts by the interpreter's start and the imports before it.
    """
    age = _process_age()
    if age is None:
        return _IMPORTED_AT
    return time.time() - age


def _process_age() -> float | None:
    """Seconds since the kernel started this process, or None when /proc cannot tell."""
    started = _start_ticks("self")
    if started is None:
        return None
    ticks_per_second = os.sysconf("SC_CLK_TCK")
    since_boot = started / ticks_per_second
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is not None:
        return max(0.0, time.clock_gettime(boottime) - since_boot)
    btime = _boot_time()
    if btime is None:
        return None
    return max(0.0, time.time() - (btime + since_boot))


def _start_ticks(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        # Field 2 (comm) is parenthesised and may hold spaces; fields after it start at field 3.
        return int(raw[raw.rindex(b")") + 2 :].split()[22 - 3])
    except (OSError, ValueError, IndexError):
        return None


def _boot_time() -> float | None:
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def bootstrap_kind(
    *, data_dir: str | os.PathLike[str] | None = None, job_id: str | None = None, margin: float = 1.0
) -> StartKind:
    """``"warm"`` when this process starts where the caches are hot, else ``"cold"``.

    The bootstrap tax differs by an order of magnitude between a fresh container (image layers and
    site-packages read from disk) and a process started where the same code just ran (page cache hot).
    Neither the attempt number nor ``AGENTLIFE_PREVIOUS_EXIT_CODE`` tells which: a retry usually lands in a
    new pod, possibly on another node. Two local facts do:

    * the process started more than ``margin`` seconds after PID 1 of its PID namespace: it is not the
      container's first program (a re-run in a live container, a supervisor restart, a developer machine);
    * ``{data_dir}/sessions/{job_id}/`` holds a session journal written before this process started: the
      pod's filesystem (an emptyDir survives container restarts) and so the node's page cache were used
      by an earlier attempt of this job.

    Anything else is ``"cold"``: a fresh container whose first program is this one. Off Linux only the
    second fact is checked.
    """
    me, init = _start_ticks("self"), _start_ticks("1")
    if me is not None and init is not None and (me - init) / os.sysconf("SC_CLK_TCK") > margin:
        return "warm"
    if data_dir is not None and job_id is not None and _has_earlier_session(Path(data_dir), job_id):
        return "warm"
    return "cold"


def _has_earlier_session(data_dir: Path, job_id: str) -> bool:
    started_ms = process_start_time() * 1000.0
    try:
        names = [p.name for p in (data_dir / "sessions" / job_id).glob("session_*_*.jsonl")]
    except OSError:
        return False
    for name in names:
        try:
            unix_ms = int(name.rsplit("_", 1)[1].removesuffix(".jsonl"))
        except (IndexError, ValueError):
            continue
        if unix_ms < started_ms:
            return True
    return False


# -- spans ----------------------------------------------------------------------------------------------


class LlmSpan:
    """The span of one LLM call, with a helper to record the response per the GenAI semantic conventions."""

    def __init__(self, span: Span) -> None:
        self.span = span

    def record_response(
        self,
        usage: Any = None,
        finish_reasons: Sequence[str] | str | None = None,
        *,
        response_model: str | None = None,
        response_id: str | None = None,
    ) -> None:
        """Set ``gen_ai.usage.*``, ``gen_ai.response.finish_reasons`` and the response model and id.

        ``usage`` is an `agentlife.Usage`, an SDK usage object or a mapping with ``input_tokens`` and
        ``output_tokens``.
        """
        input_tokens, output_tokens = _usage_tokens(usage)
        if usage is not None:
            self.span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
            self.span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
        if finish_reasons is not None:
            reasons = [finish_reasons] if isinstance(finish_reasons, str) else list(finish_reasons)
            self.span.set_attribute("gen_ai.response.finish_reasons", reasons)
        if response_model is not None:
            self.span.set_attribute("gen_ai.response.model", response_model)
        if response_id is not None:
            self.span.set_attribute("gen_ai.response.id", response_id)

    def record_reply(self, reply: Any) -> None:
        """`record_response` from an `agentlife.LLMReply` (its usage, stop reason and model)."""
        self.record_response(
            getattr(reply, "usage", None),
            getattr(reply, "stop_reason", None),
            response_model=getattr(reply, "model", None) or None,
        )

    def record_error(self, exc: BaseException) -> None:
        """Mark the call failed with ``error.type``; the exception event is added when it leaves the span."""
        from opentelemetry.trace import Status, StatusCode

        self.span.set_attribute("error.type", type(exc).__qualname__)
        self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def _usage_tokens(usage: Any) -> tuple[int, int]:
    if usage is None:
        return 0, 0
    if isinstance(usage, Mapping):
        return int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
    return int(getattr(usage, "input_tokens", 0) or 0), int(getattr(usage, "output_tokens", 0) or 0)


# -- Telemetry ------------------------------------------------------------------------------------------


class Telemetry:
    """Metrics and spans of one agent process on the OpenTelemetry SDK.

    Build it off the event loop (it imports the SDK); record from the loop; render ``/metrics`` from any
    thread with `prometheus_text`; call `shutdown` (blocking, bounded) or `ashutdown` at the end.

    Args:
        service_name: ``service.name`` unless ``OTEL_SERVICE_NAME`` is set.
        attributes: resource attributes (``agent.id``, ``job.id``, ``k8s.pod.name`` ...); they win over
            ``OTEL_RESOURCE_ATTRIBUTES``.
        env: where ``OTEL_*`` is read (default ``os.environ``). ``OTEL_METRICS_EXPORTER`` and
            ``OTEL_TRACES_EXPORTER`` take ``otlp`` (http/protobuf to ``OTEL_EXPORTER_OTLP_ENDPOINT``),
            ``console`` (to stderr) or ``none`` (the default).
        span_processors: extra span processors (tests pass an in-memory exporter's).
        metric_readers: extra metric readers.
    """

    def __init__(
        self,
        service_name: str,
        attributes: Mapping[str, Any] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        span_processors: Sequence[SpanProcessor] = (),
        metric_readers: Sequence[MetricReader] = (),
    ) -> None:
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        env = os.environ if env is None else env
        self.resource: Resource = Resource.create(resource_attributes(service_name, attributes or {}, env))
        self._reader = InMemoryMetricReader()
        readers = [self._reader, *env_metric_readers(env), *metric_readers]
        keys = {spec.name: spec.attributes for spec in INSTRUMENTS}
        # Exemplars reach nobody through /metrics: only an exporter's reader sees them.
        self.meter_provider: MeterProvider = meter_provider(
            self.resource, readers, keys, env, exemplars=len(readers) > 1
        )
        self.tracer_provider: TracerProvider = TracerProvider(resource=self.resource)
        processors = [*env_span_processors(env), *span_processors]
        for processor in processors:
            self.tracer_provider.add_span_processor(processor)
        # Without a processor a span reaches nobody either: none is made (a third of a tool call's cost).
        self._tracing = bool(processors)
        self.meter: Meter = self.meter_provider.get_meter("agentlife")
        self._tracer = self.tracer_provider.get_tracer("agentlife")
        self._lag_source: Callable[[], float] | None = None
        self._last_lag = 0.0
        self._instruments = {spec.name: _create(self.meter, spec, self._observe_lag) for spec in INSTRUMENTS}
        self._lock = threading.Lock()
        self._closed = False
        self._final_text: str | None = None
        self._bootstrap: float | None = None
        self._state: State | None = None  # the state whose series is 1 now
        self._set_state(State.BOOTING)
        self._instruments["agent.steps.completed"].add(0)

    # -- metrics --------------------------------------------------------------------------------------

    def record_transition(self, transition: Transition) -> None:
        """Move ``agent.lifecycle.state`` to ``transition.target`` (1 there, 0 in every other state)."""
        self._set_state(transition.target)

    def step_completed(self, duration: float | None = None) -> None:
        """Count a completed step and record its wall time in seconds."""
        job = _job()
        self._instruments["agent.steps.completed"].add(1, job)
        if duration is not None:
            self._instruments["agent.step.duration"].record(duration, job)

    def llm_call(self, model: str, outcome: str, usage: Any = None) -> None:
        """Count an LLM call (``outcome``: ok, timeout, error ...) and the tokens of ``usage``."""
        job = _job()
        self._instruments["agent.llm.calls"].add(1, {**job, "model": model, "outcome": outcome})
        if usage is not None:
            input_tokens, output_tokens = _usage_tokens(usage)
            tokens = self._instruments["agent.llm.tokens"]
            tokens.add(input_tokens, {**job, "model": model, "type": "input"})
            tokens.add(output_tokens, {**job, "model": model, "type": "output"})

    def rate_limit_wait(self, bucket: str, reason: str, duration: float) -> None:
        """Record one wait for rate-limit capacity (``reason``: paused, requests, input_tokens ...)."""
        attrs = {**_job(), "bucket": bucket, "reason": reason}
        self._instruments["agent.llm.rate_limit.wait"].record(duration, attrs)

    def tool_call(self, name: str, outcome: str, duration: float | None = None) -> None:
        """Count a tool call (``outcome``: ok, error, timeout, replayed ...) and its wall time."""
        attrs = {**_job(), "tool": name, "outcome": outcome}
        self._instruments["agent.tool.calls"].add(1, attrs)
        if duration is not None:
            self._instruments["agent.tool.duration"].record(duration, attrs)

    def drain(self, reason: str, duration: float | None = None) -> None:
        """Count a drain (``reason``: sigterm, completed, failed, parked ...) and how long it took."""
        attrs = {**_job(), "reason": reason}
        self._instruments["agent.drains"].add(1, attrs)
        if duration is not None:
            self._instruments["agent.drain.duration"].record(duration, attrs)

    def hydration_phase(self, phase: str, seconds: float) -> None:
        """Record one hydration phase: ``checkpoint``, ``journal_scan`` or ``memory``.

        Raises:
            ValueError: ``phase`` is not one of `HYDRATION_PHASES`.
        """
        if phase not in HYDRATION_PHASES:
            raise ValueError(f"hydration phase must be one of {HYDRATION_PHASES}, got {phase!r}")
        self._instruments["agent.hydration.duration"].record(seconds, {**_job(), "phase": phase})

    def loop_lag(self, seconds: float) -> None:
        """Publish the event loop's drift (read at the next collection; see also `follow_board`)."""
        self._last_lag = seconds

    def follow_board(self, board: StatusBoard) -> None:
        """Read ``agent.event_loop.lag`` from ``board`` (what the lag sampler ticks) at every collection.

        The gauge is observed when ``/metrics`` is scraped or an exporter collects, so the sampler on the
        agent's loop need not know about telemetry.
        """
        self._lag_source = lambda: board.snapshot().loop_lag_seconds

    def bootstrap(self, start_kind: StartKind | None = None) -> float:
        """Record ``agent.bootstrap_seconds`` (kernel process start -> now) once; return the value.

        Call it at the first tool dispatch. Later calls record nothing and return the first value.
        ``start_kind`` defaults to `bootstrap_kind()`.
        """
        if self._bootstrap is None:
            self._bootstrap = max(0.0, time.time() - process_start_time())
            kind = start_kind or bootstrap_kind()
            self._instruments["agent.bootstrap_seconds"].record(self._bootstrap, {**_job(), "start": kind})
        return self._bootstrap

    def execution(self, seconds: float) -> None:
        """Record ``agent.execution_seconds``: time spent executing the job (EXECUTING to DRAINING)."""
        self._instruments["agent.execution_seconds"].record(seconds, _job())

    # -- spans ----------------------------------------------------------------------------------------

    @contextmanager
    def step_span(self, step: int) -> Iterator[Span]:
        """A span around one step (``agent.step``)."""
        with self._span("agent.step", {"agent.step": step}) as span:
            yield span

    @contextmanager
    def llm_span(
        self,
        model: str,
        *,
        max_tokens: int | None = None,
        operation: str = "chat",
        system: str = "anthropic",
        **attributes: Any,
    ) -> Iterator[LlmSpan]:
        """A client span around one LLM call, named ``"{operation} {model}"`` (GenAI semantic conventions).

        Call `LlmSpan.record_response` with the reply's usage and stop reason before the block ends.
        """
        from opentelemetry.trace import SpanKind

        attrs: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.system": system,
            "gen_ai.provider.name": system,
            "gen_ai.request.model": model,
        }
        if max_tokens is not None:
            attrs["gen_ai.request.max_tokens"] = max_tokens
        attrs.update(attributes)
        with self._span(f"{operation} {model}", attrs, kind=SpanKind.CLIENT) as span:
            yield LlmSpan(span)

    @contextmanager
    def tool_span(self, name: str, invocation_id: str) -> Iterator[Span]:
        """A span around one tool call, named ``"execute_tool {name}"`` (GenAI semantic conventions)."""
        attrs = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": invocation_id,
        }
        with self._span(f"execute_tool {name}", attrs) as span:
            yield span

    @contextmanager
    def _span(self, name: str, attributes: Mapping[str, Any], kind: Any = None) -> Iterator[Span]:
        from opentelemetry.trace import INVALID_SPAN, SpanKind

        if not self._tracing:
            yield INVALID_SPAN
            return
        with self._tracer.start_as_current_span(
            name, kind=kind or SpanKind.INTERNAL, attributes={**_job(), **attributes}
        ) as span:
            try:
                yield span
            except BaseException as exc:
                # The SDK records Exceptions only; a cancelled call (drain deadline) should still say so.
                if not isinstance(exc, Exception):
                    span.set_attribute("agentlife.cancelled", True)
                raise

    # -- export ---------------------------------------------------------------------------------------

    def prometheus_text(self) -> str:
        """Every instrument in Prometheus text exposition format (0.0.4); safe from any thread."""
        with self._lock:
            if self._final_text is not None:
                return self._final_text
            return self._render()

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Flush and stop the exporters within ``timeout`` seconds; idempotent. Blocks: call it off the loop.

        Returns False when the exporters did not finish in time (a collector that hangs cannot hold up the
        exit; the SDK's worker threads end on their own export timeouts).
        """
        with self._lock:
            if self._closed:
                return True
            self._final_text = self._render()
            self._closed = True
        done = threading.Event()

        def stop() -> None:
            try:
                deadline_ms = timeout * 1000.0
                self.tracer_provider.force_flush(int(deadline_ms / 2))
                self.tracer_provider.shutdown()
                self.meter_provider.shutdown(timeout_millis=deadline_ms / 2)
            except Exception:
                _log.warning("telemetry shutdown failed", exc_info=True)
            finally:
                done.set()

        worker = threading.Thread(target=stop, name="agentlife-telemetry-shutdown", daemon=True)
        worker.start()
        if not done.wait(timeout):
            _log.warning("telemetry exporters did not shut down within %.1fs", timeout)
            return False
        worker.join()
        return True

    async def ashutdown(self, timeout: float = 5.0) -> bool:
        """`shutdown` on a worker thread, for the runtime's async cleanup."""
        import anyio

        return await anyio.to_thread.run_sync(self.shutdown, timeout)

    # -- internals ------------------------------------------------------------------------------------

    def _observe_lag(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        value = self._last_lag
        source = self._lag_source
        if source is not None:
            try:
                value = source()
            except Exception:  # a collection must never fail because of one gauge
                _log.debug("loop lag source failed", exc_info=True)
        return [Observation(value)]

    def _set_state(self, target: State) -> None:
        """1 for ``target``, 0 for the state it leaves; every other series is 0 already.

        Writing only the two that change (every state's series at first) keeps a worker's transitions
        cheap: its jobs make five each, and a gauge write costs the SDK tens of microseconds.
        """
        gauge = self._instruments["agent.lifecycle.state"]
        job = _job()
        previous, self._state = self._state, target
        for state in State if previous is None else dict.fromkeys((previous, target)):
            gauge.set(1 if state is target else 0, {**job, "state": state.value})

    def _render(self) -> str:
        data = self._reader.get_metrics_data()
        collected: dict[str, Any] = {}
        for resource_metrics in data.resource_metrics if data is not None else ():
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    collected[metric.name] = metric
        out: list[str] = []
        self._render_target_info(out)
        for spec in INSTRUMENTS:
            metric = collected.pop(spec.name, None)
            render_family(
                spec.name, spec.unit, spec.description, metric.data if metric else None, out, kind=spec.kind
            )
        for metric in collected.values():  # instruments the runtime added through `meter`
            render_family(metric.name, metric.unit or "", metric.description or metric.name, metric.data, out)
        return "\n".join(out) + "\n"

    def _render_target_info(self, out: list[str]) -> None:
        attrs = {k: v for k, v in self.resource.attributes.items() if not k.startswith("telemetry.sdk.")}
        out.append("# HELP target_info Target metadata")
        out.append("# TYPE target_info gauge")
        out.append(f"target_info{labels(attrs)} 1")


def _job() -> dict[str, Any]:
    """``job.id`` and ``job.attempt`` of the job the current task runs (none outside a job).

    Every measurement and span carries them. Spans keep them as attributes; the instruments aggregate
    them away (`meter_provider`'s views keep each instrument's own attributes only, so a worker running
    thousands of jobs does not grow a series per job), and they ride on the exemplars instead.
    """
    return dict(JOB_ATTRIBUTES.get())


def _create(meter: Meter, spec: InstrumentSpec, observe_lag: CallbackT) -> Any:
    if spec.name == "agent.event_loop.lag":
        # Observed at collection time: the sampler only ticks the board; a scrape reads the latest value.
        return meter.create_observable_gauge(
            spec.name, callbacks=[observe_lag], unit=spec.unit, description=spec.description
        )
    if spec.kind == "counter":
        return meter.create_counter(spec.name, unit=spec.unit, description=spec.description)
    if spec.kind == "gauge":
        return meter.create_gauge(spec.name, unit=spec.unit, description=spec.description)
    return meter.create_histogram(
        spec.name,
        unit=spec.unit,
        description=spec.description,
        explicit_bucket_boundaries_advisory=spec.buckets,
    )
