"""The chaos machinery of ``benchmarks/chaos.py`` in a tiny run: five faults over one short job
check that the script still drives real processes against the real PostgreSQL fixture and reads
the evidence back (the full run, ``nox -s chaos``, injects hundreds).
"""

from __future__ import annotations

import sys
from pathlib import Path

from _pg import PostgresServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "benchmarks"))
import chaos


def test_five_faults_over_real_processes_and_postgres(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    kinds = ["sigterm_between_steps", "sigkill", "tool_hang_after", "sigterm_twice", "sigterm_ready"]
    settings = chaos.ChaosSettings(
        faults=5, seed=7, parallel=1, kinds=kinds, faults_per_job=(5, 5), steps=(8, 8), quiet=True
    )
    try:
        report, run = chaos.run_chaos(settings, postgres_server, tmp_path)
    finally:
        postgres_server.start()  # whatever happened, leave the shared server up for the next test
    text = chaos.render(report, settings)
    assert sum(report.faults.values()) >= 5, text
    assert report.jobs == report.jobs_completed >= 1, text
    assert report.bad == 0, text
    assert report.runs >= 6  # five faulted attempts, then at least one that completes its job
    assert report.drains >= 2  # the SIGTERM kinds were measured as drains
    for job in run.jobs:  # every step's effect happened exactly once, by the evidence file
        effects = (tmp_path / job.job_id / "evidence" / "effects").read_text().split("\n")
        ids = [line.split()[0] for line in effects if line]
        assert sorted(ids) == sorted(f"{job.job_id}/{s}/1" for s in range(job.steps))
    assert "| runs | faults injected | jobs completed | lost steps |" in text
