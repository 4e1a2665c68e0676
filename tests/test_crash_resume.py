"""SIGKILL at seeded random moments, rerun until done: nothing lost, nothing repeated beyond the contract."""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from procs import agent_env, spawn

KILLS_PER_JOB = 26  # two jobs: 52 kills in the suite, each landing while the job still had work to do
STEPS = 150  # enough work that every kill lands before the job completes


def _run_until_done(tmp_path: Path, *, verify: bool, seed: int) -> tuple[int, Path]:
    rng = random.Random(seed)
    logs = tmp_path / "logs"
    logs.mkdir()
    kills = 0
    attempt = 0
    while True:
        attempt += 1
        env = agent_env(
            tmp_path / "data",
            AGENTLIFE_JOB_ID="kill-job",
            AGENTLIFE_ATTEMPT=str(attempt),
            AGENTLIFE_HEALTH_PORT="off",
            KILL_LOG_DIR=str(logs),
            KILL_VERIFY="1" if verify else "0",
            KILL_STEPS=str(STEPS),
        )
        proc = spawn("agents.kill_agent:KillAgent", env)
        if kills < KILLS_PER_JOB:
            assert _kill_while_running(proc, rng), "the job completed before every kill landed: add steps"
            kills += 1
            continue
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (proc.returncode, (out + err).decode()[-3000:])
        return kills, logs


def _kill_while_running(proc: subprocess.Popen[bytes], rng: random.Random) -> bool:
    """SIGKILL at a random moment after the step loop started; False if the process had already exited."""
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    for raw in proc.stdout:
        if b"READY -> EXECUTING" in raw or b'"exit_code"' in raw or time.monotonic() > deadline:
            break
    time.sleep(rng.uniform(0.0, 0.4))
    alive = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    return alive and proc.returncode == -signal.SIGKILL


def _lines(path: Path) -> list[tuple[str, int]]:
    if not path.exists():
        return []
    return [(line.split()[0], int(line.split()[1])) for line in path.read_text().splitlines()]


def _final(tmp_path: Path) -> dict[str, object]:
    conn = sqlite3.connect(tmp_path / "data" / "agentlife.db")
    (status, result) = conn.execute("SELECT status, result FROM job WHERE id = 'kill-job'").fetchone()
    conn.close()
    assert status == "COMPLETED"
    out = orjson.loads(result)
    assert isinstance(out, dict)
    return out


def _reissued_per_attempt(records: list[tuple[str, int]]) -> Counter[int]:
    """For each attempt, how many of its calls had already been made by an earlier attempt."""
    first_attempt: dict[str, int] = {}
    repeats: Counter[int] = Counter()
    for key, attempt in records:
        if key in first_attempt and first_attempt[key] < attempt:
            repeats[attempt] += 1
        first_attempt.setdefault(key, attempt)
    return repeats


@pytest.mark.slow(14)
def test_sigkill_with_verify_runs_each_side_effect_exactly_once(tmp_path: Path) -> None:
    kills, logs = _run_until_done(tmp_path, verify=True, seed=1234)
    assert kills == KILLS_PER_JOB
    effects = _lines(logs / "effects")
    ids = [key for key, _ in effects]
    assert sorted(ids) == sorted(f"kill-job/{s}/1" for s in range(STEPS))  # exactly once each
    assert _final(tmp_path) == {"steps": list(range(STEPS))}  # no completed step lost or repeated
    assert max(_reissued_per_attempt(_lines(logs / "llm")).values(), default=0) <= 1


@pytest.mark.slow(12)
def test_sigkill_without_verify_reruns_at_most_one_call_per_kill(tmp_path: Path) -> None:
    kills, logs = _run_until_done(tmp_path, verify=False, seed=5678)
    effects = _lines(logs / "effects")
    assert {key for key, _ in effects} == {f"kill-job/{s}/1" for s in range(STEPS)}
    assert len(effects) - STEPS <= kills
    assert max(_reissued_per_attempt(effects).values(), default=0) <= 1
    assert max(_reissued_per_attempt(_lines(logs / "llm")).values(), default=0) <= 1
    assert _final(tmp_path) == {"steps": list(range(STEPS))}
