"""Failure policy helpers: retry decisions, circuit breaker, phase budget and its CLI."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from agentlife.stores._policy import (
    CircuitBreaker,
)

# -- should_retry_after_crash ---------------------------------------------------------------------------


def crash(error_class: str = "ValueError", message: str = "boom", exit_code: int = 1) -> dict[str, Any]:
    return {"exit_code": exit_code, "error_class": error_class, "message": message, "at": 1.0, "attempt": 1}


A, B, C, D, E = (crash(message=m) for m in "abcde")


# -- circuit breaker ------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker(failure_threshold=3, window=900, cooldown=1800, clock=clock)


# -- CLI --------------------------------------------------------------------------------------------------


def test_python_m_agentlife_budget_end_to_end() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "agentlife", "budget", "--init-p95", "95.4", "--exec-p95", "420",
         "--safety-buffer", "180"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[-1] == "rounded up to a multiple of 60 s: 720 s"
    bad = subprocess.run(
        [sys.executable, "-m", "agentlife", "budget", "--init-p95", "x", "--exec-p95", "1",
         "--safety-buffer", "1"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1
    assert "Traceback" not in bad.stderr


def test_policy_module_imports_no_heavy_client() -> None:
    heavy = ("asyncpg", "aiohttp", "httpx", "anthropic", "qdrant_client")
    code = f"import sys, agentlife.stores._policy; print([m for m in {heavy!r} if m in sys.modules])"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
