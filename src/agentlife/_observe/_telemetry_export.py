"""Exporters from the standard ``OTEL_*`` environment: OTLP (HTTP/protobuf) and console.

For metrics and spans, with the endpoints, headers and timeouts the OpenTelemetry specification defines.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor


__all__ = [
    "exporters_configured",
    "meter_provider",
    "metric_readers",
    "resource_attributes",
    "span_processors",
]

_log = logging.getLogger("agentlife.telemetry")

# -- exporters from the OTEL_* environment --------------------------------------------------------------


def _exporter_names(env: Mapping[str, str], variable: str) -> list[str]:
    names = [n.strip().lower() for n in env.get(variable, "none").split(",") if n.strip()]
    return [] if "none" in names else names


def exporters_configured(env: Mapping[str, str]) -> bool:
    """Whether ``OTEL_METRICS_EXPORTER`` or ``OTEL_TRACES_EXPORTER`` asks for something to send data to.

    ``prometheus`` is served by the probe server's ``/metrics`` and sends nothing, so it does not count.
    """
    metrics = [n for n in _exporter_names(env, "OTEL_METRICS_EXPORTER") if n != "prometheus"]
    return bool(metrics or _exporter_names(env, "OTEL_TRACES_EXPORTER"))


def _otlp_endpoint(env: Mapping[str, str], signal: str) -> str:
    specific = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "").strip()
    if specific:
        return specific
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or "http://localhost:4318"
    return f"{base.rstrip('/')}/v1/{signal}"


def _otlp_headers(env: Mapping[str, str], signal: str) -> dict[str, str]:
    raw = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS", "")
    headers: dict[str, str] = {}
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            headers[unquote(key.strip())] = unquote(value.strip())
    return headers


def _otlp_timeout(env: Mapping[str, str], signal: str) -> float | None:
    """Export timeout in seconds, as the installed OTLP exporter reads ``OTEL_EXPORTER_OTLP_TIMEOUT``."""
    raw = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_TIMEOUT") or env.get("OTEL_EXPORTER_OTLP_TIMEOUT")
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        _log.warning("OTLP timeout %r is not a number; using the exporter's default", raw)
        return None
    return value if value > 0 else None


def _check_protocol(env: Mapping[str, str], signal: str) -> None:
    protocol = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    if protocol and protocol.strip() != "http/protobuf":
        _log.warning("OTLP protocol %r is not supported; exporting %s over http/protobuf", protocol, signal)


def metric_readers(env: Mapping[str, str]) -> list[MetricReader]:
    readers: list[MetricReader] = []
    for name in _exporter_names(env, "OTEL_METRICS_EXPORTER"):
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

        exporter: Any
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            _check_protocol(env, "metrics")
            exporter = OTLPMetricExporter(
                endpoint=_otlp_endpoint(env, "metrics"),
                headers=_otlp_headers(env, "metrics") or None,
                timeout=_otlp_timeout(env, "metrics"),
            )
        elif name == "console":
            # stdout carries the JSON log lines; exporter output must not interleave with them.
            exporter = ConsoleMetricExporter(out=sys.stderr)
        elif name == "prometheus":
            _log.debug("OTEL_METRICS_EXPORTER=prometheus: served by the probe server at /metrics")
            continue
        else:
            _log.warning(
                "OTEL_METRICS_EXPORTER=%s is not supported (use otlp, console or none); ignored", name
            )
            continue
        interval = _env_float(env, "OTEL_METRIC_EXPORT_INTERVAL", 60_000.0)
        timeout = _env_float(env, "OTEL_METRIC_EXPORT_TIMEOUT", 30_000.0)
        readers.append(
            PeriodicExportingMetricReader(
                exporter, export_interval_millis=interval, export_timeout_millis=timeout
            )
        )
    return readers


def span_processors(env: Mapping[str, str]) -> list[SpanProcessor]:
    processors: list[SpanProcessor] = []
    for name in _exporter_names(env, "OTEL_TRACES_EXPORTER"):
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )

        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            _check_protocol(env, "traces")
            exporter = OTLPSpanExporter(
                endpoint=_otlp_endpoint(env, "traces"),
                headers=_otlp_headers(env, "traces") or None,
                timeout=_otlp_timeout(env, "traces"),
            )
            processors.append(BatchSpanProcessor(exporter))
        elif name == "console":
            processors.append(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
        else:
            _log.warning(
                "OTEL_TRACES_EXPORTER=%s is not supported (use otlp, console or none); ignored", name
            )
    return processors


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        value = float(env.get(name, default))
    except ValueError:
        _log.warning("%s=%r is not a number; using %g", name, env.get(name), default)
        return default
    return value if value > 0 else default


def resource_attributes(
    service_name: str, attributes: Mapping[str, Any], env: Mapping[str, str]
) -> dict[str, Any]:
    """Resource attributes: ``OTEL_RESOURCE_ATTRIBUTES``, then the caller's, then ``service.name``."""
    merged: dict[str, Any] = {}
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            merged[unquote(key.strip())] = unquote(value.strip())
    merged.update({k: v for k, v in attributes.items() if v is not None})
    merged["service.name"] = env.get("OTEL_SERVICE_NAME", "").strip() or service_name
    return merged


def meter_provider(
    resource: Resource,
    readers: list[MetricReader],
    attribute_keys: Mapping[str, Sequence[str]],
    env: Mapping[str, str],
    *,
    exemplars: bool = True,
) -> MeterProvider:
    """The `MeterProvider`: each instrument of ``attribute_keys`` aggregated by those attributes only.

    A measurement may carry more (a worker's ``job.id`` and ``job.attempt``); the views leave them out of
    the series, so none grows per job, and the exemplars keep them (``filtered_attributes`` in an OTLP
    export). With ``exemplars`` (an exporter's reader is among ``readers``) every measurement is offered
    as an exemplar, without none is (``/metrics`` shows no exemplar, and offering one is most of a
    measurement's cost), unless ``OTEL_METRICS_EXEMPLAR_FILTER`` says otherwise; an SDK without exemplars
    (before 1.27) just drops them.
    """
    from opentelemetry.sdk import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.view import View

    views = [View(instrument_name=name, attribute_keys=set(keys)) for name, keys in attribute_keys.items()]
    kwargs: dict[str, Any] = {"resource": resource, "metric_readers": readers, "views": views}
    filters = {
        "always_on": getattr(metrics, "AlwaysOnExemplarFilter", None),
        "always_off": getattr(metrics, "AlwaysOffExemplarFilter", None),
        "trace_based": getattr(metrics, "TraceBasedExemplarFilter", None),
    }
    default = "always_on" if exemplars else "always_off"
    chosen = env.get("OTEL_METRICS_EXEMPLAR_FILTER", "").strip().lower() or default
    if chosen not in filters:
        _log.warning(
            "OTEL_METRICS_EXEMPLAR_FILTER=%r is not always_on, always_off or trace_based", chosen[:40]
        )
        chosen = default
    exemplar_filter = filters[chosen]
    if exemplar_filter is None:
        return MeterProvider(**kwargs)
    # Passed explicitly: the SDK would otherwise read the variable from os.environ, not from ``env``.
    return MeterProvider(**kwargs, exemplar_filter=exemplar_filter())
