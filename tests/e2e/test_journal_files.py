"""The journal's file in a real process: a short write resumes where the kernel stopped, a fresh
job logs no scan warning, a session symlink leading outside the data dir is refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from agentlife._journal._writer import list_sessions
from procs import REPO, agent_env, json_lines, run_cli

# -- journal short writes ------------------------------------------------------------------------------

_SHORT_WRITE_SCRIPT = textwrap.dedent(
    """
    import os, resource, signal, sys
    import anyio
    from agentlife._journal._writer import Journal

    async def main(directory):
        journal = Journal.create(directory, 1)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        # The disk "fills" in the middle of the third line: the kernel takes part of the write.
        resource.setrlimit(resource.RLIMIT_FSIZE, (150, hard))
        for i in range(6):
            journal.append("STEP_STARTED", step=i, pad="x" * 20)
        try:
            await journal.flush(fsync=True)
        except OSError as exc:
            print("flush failed:", exc.errno, flush=True)
        try:
            await journal.flush(fsync=True)  # still full: nothing more may be written twice
        except OSError:
            pass
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space again
        journal.append("STEP_STARTED", step=6, pad="x" * 20)
        await journal.aclose()

    anyio.run(main, sys.argv[1])
    """
)


def test_a_short_write_resumes_where_the_kernel_stopped(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    result = subprocess.run(
        [sys.executable, "-c", _SHORT_WRITE_SCRIPT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "flush failed: 27" in result.stdout  # EFBIG: the limit was really hit mid-buffer
    (path,) = list_sessions(tmp_path)
    lines = path.read_bytes().splitlines()
    events = [orjson.loads(line) for line in lines]  # every line whole: no torn or doubled bytes
    assert [e["seq"] for e in events] == list(range(7))
    assert [e["step"] for e in events] == list(range(7))


# -- a fresh job does not warn ---------------------------------------------------------------------------


def test_a_fresh_job_logs_no_warning_about_the_journal_scan(tmp_path: Path) -> None:
    env = agent_env(tmp_path / "data", TEST_STEPS="1")
    result = run_cli("run", "agents.drain_agent:DrainAgent", "--job-id", "fresh", env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = json_lines(result.stdout)
    scan = [line for line in lines if str(line.get("msg", "")).startswith("journal scan")]
    assert scan and all(line["level"] == "INFO" for line in scan), scan
    assert [line for line in lines if line["level"] == "WARNING"] == []


# -- data-dir containment --------------------------------------------------------------------------------


@pytest.mark.parametrize("link", ["sessions", "sessions/j"])
def test_a_session_symlink_leading_outside_the_data_dir_is_refused(tmp_path: Path, link: str) -> None:
    data, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    (data / link).parent.mkdir(parents=True)
    (data / link).symlink_to(outside, target_is_directory=True)
    result = run_cli("run", "agents.drain_agent:DrainAgent", "--job-id", "j", env=agent_env(data))
    assert result.returncode == 1
    assert any("outside the data directory" in str(line.get("msg")) for line in json_lines(result.stdout))
    assert list(outside.iterdir()) == []
