"""SIGHUP drains like SIGTERM; SIGUSR1 dumps every thread's stack and goes on; SIGQUIT dumps and quits."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from procs import agent_env, json_lines, spawn, terminate, wait_for


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    return agent_env(tmp_path / "data", AGENTLIFE_JOB_ID="job-o", TEST_MARKER_DIR=str(markers), **extra)


def test_sighup_drains_like_sigterm_with_143(tmp_path: Path) -> None:
    proc = spawn(
        "agents.drain_agent:DrainAgent", _env(tmp_path, TEST_STEPS="100000", TEST_STEP_SECONDS="0.005")
    )
    wait_for(tmp_path / "markers" / "step-5-done")
    code, elapsed, out = terminate(proc, signal.SIGHUP)
    assert code == 143, out
    assert elapsed < 10.0  # between 5 ms steps: no 45 s step deadline waited for
    assert any("drained by SIGHUP" in str(line.get("msg")) for line in json_lines(out)), out


def test_sigusr1_dumps_every_threads_stack_and_the_job_goes_on(tmp_path: Path) -> None:
    proc = spawn("agents.drain_agent:DrainAgent", _env(tmp_path, TEST_STEPS="60", TEST_STEP_SECONDS="0.02"))
    wait_for(tmp_path / "markers" / "step-3-done")
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    dump = err.decode()
    assert "Current thread" in dump or "Thread 0x" in dump
    assert "agentlife" in dump  # frames of the running process, e.g. the probe thread's loop
    assert (tmp_path / "markers" / "step-59-done").exists()


def test_sigquit_dumps_the_stacks_and_quits_at_once_without_a_drain(tmp_path: Path) -> None:
    proc = spawn(
        "agents.drain_agent:DrainAgent", _env(tmp_path, TEST_STEPS="100000", TEST_STEP_SECONDS="0.005")
    )
    wait_for(tmp_path / "markers" / "step-5-done")
    started = time.monotonic()
    code, _, out = terminate(proc, signal.SIGQUIT)
    assert code == -signal.SIGQUIT
    assert time.monotonic() - started < 10.0  # generous: a loaded machine's exit, not a drain's deadlines
    assert "Thread 0x" in out or "Current thread" in out
    assert not any("DRAINING" in str(line.get("msg")) for line in json_lines(out))
