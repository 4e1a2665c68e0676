"""A full disk (a real 1 MiB tmpfs) in a drain or a checkpoint: the right exit code, one line per error."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from procs import agent_env, spawn, terminate, wait_for


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _env(small_disk: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    return agent_env(
        small_disk,
        AGENTLIFE_JOB_ID="job-f",
        FULL_MARKER=str(tmp_path / "filled"),
        AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS="1",
        AGENTLIFE_DRAIN_CLEANUP_BUDGET_SECONDS="1",
        **extra,
    )


def _assert_one_line_errors(out: str) -> None:
    lines = [line for line in out.splitlines() if line]
    assert all(line.startswith("{") for line in lines), out  # JSON log lines only: no raw traceback


def test_a_drain_on_a_full_disk_still_exits_143(small_disk: Path, tmp_path: Path) -> None:
    proc = spawn("agents.full_disk_agent:FullDiskAgent", _env(small_disk, tmp_path, FULL_WAIT="1"))
    wait_for(tmp_path / "filled")
    code, elapsed, out = terminate(proc, signal.SIGTERM)
    assert code == 143, out
    assert elapsed < 5
    _assert_one_line_errors(out)
    assert "No space left on device" in out  # said, once per failing step of the cleanup


def test_a_checkpoint_on_a_full_disk_is_a_crash_that_says_so_at_once(
    small_disk: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    proc = spawn("agents.full_disk_agent:FullDiskAgent", _env(small_disk, tmp_path))
    out, err = proc.communicate(timeout=60)
    text = (out + err).decode()
    assert proc.returncode == 1, text
    assert time.monotonic() - started < 15  # not 31 s of retries that cannot succeed
    assert "database or disk is full" in text
    assert "cannot rollback" not in text
    _assert_one_line_errors(text)
