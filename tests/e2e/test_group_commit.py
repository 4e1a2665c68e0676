"""The step's durable writes grouped: what a SIGKILL at each new group-commit point leaves behind.

A step's LLM reply and read-only results are made durable with the step's checkpoint (or by the next
side effect's write-ahead record), and its model usage is counted by the checkpoint's one commit. A kill
after a batched read-only result but before the checkpoint re-runs that read, never a side effect, and
counts each paid model call exactly once.
"""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

import orjson
import pytest

from procs import agent_env, spawn


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _run(tmp_path: Path, attempt: int, **extra: str) -> tuple[int, str]:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    env = agent_env(
        tmp_path / "data",
        AGENTLIFE_JOB_ID="gc-job",
        AGENTLIFE_ATTEMPT=str(attempt),
        AGENTLIFE_HEALTH_PORT="off",
        GC_LOG_DIR=str(logs),
        **extra,
    )
    proc = spawn("agents.group_commit_agent:GroupCommitAgent", env)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, (out + err).decode()


def _tokens(tmp_path: Path) -> dict[str, object]:
    conn = sqlite3.connect(tmp_path / "data" / "agentlife.db")
    try:
        (value,) = conn.execute("SELECT tokens_consumed FROM job WHERE id = 'gc-job'").fetchone()
    finally:
        conn.close()
    return dict(orjson.loads(value))


@pytest.mark.parametrize("kill_step", ["0", "1"])
def test_sigkill_after_a_batched_read_before_the_checkpoint_reruns_the_read_never_the_effect(
    tmp_path: Path, kill_step: str
) -> None:
    code, output = _run(tmp_path, 1, GC_KILL_STEP=kill_step, GC_STEPS="3")
    assert code == -signal.SIGKILL, output
    code, output = _run(tmp_path, 2, GC_KILL_STEP=kill_step, GC_STEPS="3")
    assert code == 0, output[-3000:]

    logs = tmp_path / "logs"
    # The side effect's completion was durable before the read ran: no effect twice, without verify.
    assert _lines(logs / "effects") == ["gc-job/0/1", "gc-job/1/1", "gc-job/2/1"]
    # The read-only result was only buffered: the killed step's read runs again, and only that one.
    killed_read = f"gc-job/{kill_step}/2"
    assert sorted(_lines(logs / "reads")) == sorted(["gc-job/0/2", "gc-job/1/2", "gc-job/2/2", killed_read])
    # The LLM reply went out with the side effect's write-ahead record: replayed, not re-issued.
    assert _lines(logs / "llm") == ["step 0", "step 1", "step 2"]
    # Each paid call counted once: the killed step's call by the resumed step's checkpoint.
    assert _tokens(tmp_path) == {"input": 30, "output": 15, "cost_usd": pytest.approx(0.0)}


def test_a_crashed_step_counts_its_usage_at_once_and_its_replay_does_not_count_it_again(
    tmp_path: Path,
) -> None:
    # Attempt 1 dies at its own hand after the effect of step 1, raising instead of being killed.
    code, output = _run(tmp_path, 1, GC_KILL_STEP="never", GC_STEPS="3", GC_RAISE_STEP="1")
    assert code == 1, output[-3000:]
    assert _tokens(tmp_path)["input"] == 20  # step 0 by its checkpoint, step 1's call when it crashed
    code, output = _run(tmp_path, 2, GC_STEPS="3")
    assert code == 0, output[-3000:]
    assert _lines(tmp_path / "logs" / "llm") == ["step 0", "step 1", "step 2"]
    assert _tokens(tmp_path)["input"] == 30  # the replayed call of step 1 is not counted twice
