"""Every regular expression of the package costs time linear in its input, even under ``search``.

A redaction pattern that backtracked over long alphanumeric runs from every position froze a job for
minutes. This audit finds every compiled pattern at module level (alone or in a tuple, list or dict) and
runs it on long runs of the characters quantifiers repeat, behind the prefixes that start a match attempt
and before a character that makes it fail. It compares the cost of a 32x longer input with a short one,
with a noise floor: linear patterns stay far below the bound, quadratic ones (the old URL pattern, two
adjacent ``\\s*`` around an optional group) exceed it by orders of magnitude. No absolute time is asserted.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import time
from collections.abc import Callable

import pytest

import agentlife

SMALL, LARGE = 1_000, 32_000
# A linear pattern costs at most ~32x more on the large input; a quadratic one ~1000x.
GENEROUS = 8 * (LARGE // SMALL)
NOISE_FLOOR = 0.001  # seconds: a small input's cost below this is noise, not a baseline
PREFIXES = ["", "x", "A", "a://", "a://u:", "token", "bearer ", "sk-", "x:", "*"]
RUNS = ["a", "0", " ", "\t", "-", ":", "/", "@", "a-", "a:", "://", "*", "(", "_", "A ", ".", "\n", "a0+"]
TAILS = ["!", ""]


def package_patterns() -> dict[str, re.Pattern[str]]:
    """Every module-level compiled pattern of agentlife, by dotted name."""
    found: dict[str, re.Pattern[str]] = {}
    for info in pkgutil.walk_packages(agentlife.__path__, "agentlife."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            values = value.values() if isinstance(value, dict) else value
            items = values if isinstance(values, (tuple, list)) or isinstance(value, dict) else [value]
            for i, item in enumerate(items):
                if isinstance(item, re.Pattern) and isinstance(item.pattern, str):
                    found[f"{info.name}.{name}" + (f"[{i}]" if item is not value else "")] = item
    return found


def _cost(call: Callable[[str], object], text: str, tries: int = 3) -> float:
    best = float("inf")
    for _ in range(tries):  # the least of several: a pause of the machine is not the pattern's cost
        start = time.perf_counter()
        call(text)
        best = min(best, time.perf_counter() - start)
    return best


def _superlinear(pattern: re.Pattern[str], scale: int = 1) -> str | None:
    """The first input on which ``pattern`` costs far more than linear, or None.

    ``scale`` divides both input sizes (their ratio, and so the bound, stays): a pattern known to be
    quadratic shows it on shorter inputs, in a quarter of the time.
    """
    for prefix in PREFIXES:
        for run in RUNS:
            for tail in TAILS:
                small = prefix + run * (SMALL // scale // len(run)) + tail
                large = prefix + run * (LARGE // scale // len(run)) + tail
                for call in (pattern.search, pattern.match):
                    cost = _cost(call, large, tries=1)
                    if cost <= GENEROUS * NOISE_FLOOR:
                        continue  # under the bound whatever the small input costs: not worth measuring
                    cost = min(cost, _cost(call, large, tries=1))
                    if cost > GENEROUS * max(_cost(call, small), NOISE_FLOOR):
                        return f"{call.__name__}({prefix!r} + {run!r} * n + {tail!r})"
    return None


def test_the_audit_finds_the_patterns_of_the_package() -> None:
    names = package_patterns()
    assert "agentlife._redact._WORD_END" in names and "agentlife._schema._ARG_LINE" in names
    assert any(name.startswith("agentlife._redact._PATTERNS[") for name in names)


@pytest.mark.parametrize(
    "pattern",
    [r"(?i)([a-z][a-z0-9+.-]*://[^:/@\s'\"]*:)([^\s'\"]+)(@)", r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$"],
    ids=["old URL password", "old docstring argument line"],
)
def test_the_audit_catches_the_quadratic_patterns_that_were_fixed(pattern: str) -> None:
    assert _superlinear(re.compile(pattern), scale=2) is not None


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(package_patterns()))
def test_no_pattern_of_the_package_is_superlinear(name: str) -> None:
    assert _superlinear(package_patterns()[name]) is None
