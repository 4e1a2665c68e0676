"""Prometheus naming and the text exposition format, rendered from the SDK's in-memory metrics."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


__all__ = ["labels", "prometheus_name", "render_family"]

_UNIT_SUFFIX = {
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "%": "percent",
    "m": "meters",
}


# -- Prometheus naming and text exposition --------------------------------------------------------------


def prometheus_name(name: str, unit: str = "", kind: str = "gauge") -> str:
    """The Prometheus family name of an OpenTelemetry instrument.

    Dots and other invalid characters become underscores and the unit's base-unit suffix is appended
    unless already there (``s`` -> ``_seconds``; annotations in braces add nothing). Counters' samples add
    ``_total`` to this family name.
    """
    base = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    if base[:1].isdigit():
        base = "_" + base
    suffix = _UNIT_SUFFIX.get(unit)
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    if kind == "counter":
        base = base.removesuffix("_total")
    return base


def _label_name(key: str) -> str:
    name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
    return "_" + name if name[:1].isdigit() else name


def _label_value(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(attributes: Mapping[str, Any], extra: tuple[str, str] | None = None) -> str:
    pairs = [(_label_name(k), _label_value(v)) for k, v in sorted(attributes.items())]
    if extra is not None:
        pairs.append(extra)
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def render_family(
    name: str, unit: str, description: str, data: Any, out: list[str], *, kind: str = "gauge"
) -> None:
    """Append the HELP/TYPE lines and samples of one metric (``data`` None: metadata only, as ``kind``)."""
    from opentelemetry.sdk.metrics.export import Gauge, Histogram, Sum

    if isinstance(data, Histogram):
        kind = "histogram"
    elif isinstance(data, Sum) and data.is_monotonic:
        kind = "counter"
    elif data is not None:
        kind = "gauge"
    family = prometheus_name(name, unit, kind)
    # In the 0.0.4 text format a counter's metadata names its samples, ``_total`` included.
    sample = f"{family}_total" if kind == "counter" else family
    out.append(f"# HELP {sample} {_help(description)}")
    out.append(f"# TYPE {sample} {kind}")
    if data is None:
        return
    if isinstance(data, Histogram):
        for point in data.data_points:
            attrs = dict(point.attributes or {})
            cumulative = 0
            for bound, count in zip(point.explicit_bounds, point.bucket_counts, strict=False):
                cumulative += count
                out.append(f"{family}_bucket{labels(attrs, ('le', _number(float(bound))))} {cumulative}")
            out.append(f"{family}_bucket{labels(attrs, ('le', '+Inf'))} {point.count}")
            out.append(f"{family}_sum{labels(attrs)} {_number(point.sum)}")
            out.append(f"{family}_count{labels(attrs)} {point.count}")
        return
    assert isinstance(data, (Sum, Gauge))
    for number in data.data_points:
        out.append(f"{sample}{labels(dict(number.attributes or {}))} {_number(number.value)}")
