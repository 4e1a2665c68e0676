"""Shared helpers of the benchmark scripts: result lines, process timing, free ports."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def emit(
    bench: str,
    metric: str,
    value: float,
    unit: str,
    *,
    baseline: float | None = None,
    target: str = "",
    ok: bool | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Print one result line (JSON) the way `benchmarks/run.py` collects them."""
    ratio = (value / baseline) if baseline else None
    line = {
        "bench": bench,
        "metric": metric,
        "value": round(value, 6),
        "unit": unit,
        "baseline": None if baseline is None else round(baseline, 6),
        "ratio": None if ratio is None else round(ratio, 3),
        "target": target,
        "pass": ok if ok is not None else True,
        **extra,
    }
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()
    return line


def median(values: list[float]) -> float:
    return statistics.median(values)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a measured child: this one without agentlife's variables, with bytecode caching.

    A pod runs from an installed wheel, whose modules are compiled once; without ``.pyc`` files every
    spawn compiles agentlife from source (about three times the import cost), so a shell's
    ``PYTHONDONTWRITEBYTECODE`` is dropped for the children (the ``__pycache__`` folders are git-ignored).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTLIFE_", "ANTHROPIC_", "OTEL_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "benchmarks"), str(REPO / "src"), env.get("PYTHONPATH", "")]
    )
    env.update(extra)
    return env


def compile_sources() -> None:
    """Write the ``.pyc`` files of agentlife and the benchmark agents first, so no timed spawn compiles."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(REPO / "src"), str(REPO / "benchmarks")],
        check=True,
        env=child_env(),
        stdout=subprocess.DEVNULL,
    )
