"""The journal on a full disk: a short write is resumed where the kernel stopped, never written twice.

A real kernel limit, not a mock: a child process lowers RLIMIT_FSIZE (with SIGXFSZ ignored, writes past
it are short, then fail with EFBIG, as on a full disk), appends, flushes, then raises the limit again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from procs import REPO

CHILD = r"""
import resource, signal, sys
from pathlib import Path
import anyio
from agentlife._journal._writer import Journal

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

async def main(directory):
    journal = Journal.create(Path(directory), attempt=1)
    resource.setrlimit(resource.RLIMIT_FSIZE, (journal.path.stat().st_size + 700, resource.RLIM_INFINITY))
    for i in range(20):
        journal.append("STEP_STARTED", step=i, pad="x" * 80)
    try:
        await journal.flush(fsync=False)
    except OSError as exc:
        print("first flush failed:", exc.errno, flush=True)
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    journal.append("STEP_STARTED", step=20, pad="")
    await journal.aclose()
    print(journal.path)

anyio.run(main, sys.argv[1])
"""


def test_a_short_write_on_a_full_disk_is_resumed_and_no_event_is_duplicated(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "first flush failed: 27" in done.stdout  # EFBIG: the limit really cut the write short
    path = Path(done.stdout.strip().splitlines()[-1])
    lines = path.read_bytes().splitlines()
    events = [orjson.loads(line) for line in lines]  # every line whole: no torn line left behind
    steps = [e["step"] for e in events if e["type"] == "STEP_STARTED"]
    assert steps == list(range(21))
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(len(seqs)))
