"""Masking secrets costs time linear in the text: a megabyte against a kilobyte, per byte, in the same run.

The redactor (``agentlife._redact``) runs on every log line, journal record, crash record and ``/status``
answer, including tool results of any size. Its old URL-password pattern backtracked over runs of letters and
digits from every position: ``"acgt" * 20_000`` took 141 s and a tool returning 80 K hex characters froze
the job and its probes. For each adversarial shape this measures the cost per byte of masking 1 MB against
masking 1 KB (the baseline, the same text cut short): linear code costs about the same per byte at both
sizes (a megabyte no longer fits the CPU's caches, which makes it up to ~2x dearer per byte), a quadratic one
a thousand times more. Target: <= 4x. Also reported: masking 1 MB of each shape, in milliseconds
(informative).

The redactor is the one a process builds from a realistic environment (an API key, a token, a database URL
whose password holds a space), so the exact-value pass runs over its every spelling too.
"""

from __future__ import annotations

import argparse
import secrets
import time
from collections.abc import Callable

from _common import emit, median

from agentlife._redact import Redactor

KILOBYTE, MEGABYTE = 1_000, 1_000_000
TARGET = 4.0

ENV = {
    "ANTHROPIC_API_KEY": "sk-ant-api03-" + "k" * 40,
    "AGENTLIFE_CONTROL_PLANE_TOKEN": "cp-token-5f2a9c7e",
    "AGENTLIFE_DATABASE_URL": "postgresql://agent:hun ter2 it's@db.internal:5432/jobs",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
}


def _log_line(size: int) -> str:
    line = (
        '{"msg": "tool http_request returned 200", "url": "https://api.example.com:443/v1/items?page=2",'
        ' "headers": {"authorization": "Bearer abcdef0123456789"}, "dsn": "postgresql://u:pw@db/x"} '
    )
    return (line * (size // len(line) + 1))[:size]


SHAPES: dict[str, Callable[[int], str]] = {
    "a run of 'acgt' (the 141 s case)": lambda n: ("acgt" * (n // 4 + 1))[:n],
    "random hex (a tool's binary dump)": lambda n: secrets.token_hex(n // 2 + 1)[:n],
    "repeated '://a:' (a URL prefix at every position)": lambda n: ("://a:" * (n // 5 + 1))[:n],
    "one word of 'a://b:c@' (a URL password spanning the text)": lambda n: ("a://b:c@" * (n // 8 + 1))[:n],
    "log lines with URLs, tokens and a bearer header": _log_line,
}


def per_byte_seconds(redactor: Redactor, text: str, min_seconds: float = 0.2) -> float:
    """The median cost per byte of ``redactor.redact(text)``, over repeats lasting ``min_seconds`` in all."""
    samples: list[float] = []
    spent = 0.0
    while spent < min_seconds or len(samples) < 5:
        started = time.perf_counter()
        redactor.redact(text)
        elapsed = time.perf_counter() - started
        samples.append(elapsed / len(text))
        spent += elapsed
    return median(samples)


def bench_shapes() -> None:
    redactor = Redactor.from_env(ENV)
    for shape, make in SHAPES.items():
        small = per_byte_seconds(redactor, make(KILOBYTE))
        large = per_byte_seconds(redactor, make(MEGABYTE), min_seconds=1.0)
        emit(
            "redact",
            f"per-byte cost of masking 1 MB vs 1 KB: {shape}",
            large * 1e9,
            "ns/byte",
            baseline=small * 1e9,
            target=f"<= {TARGET:g}x (linear)",
            ok=large / small <= TARGET,
        )
        emit("redact", f"masking 1 MB: {shape}", large * MEGABYTE * 1000, "ms", target="informative")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    bench_shapes()
