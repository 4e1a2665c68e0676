"""One worker at ``--concurrency 50`` vs ``--concurrency 1`` on 50 model-latency-bound jobs, same run.

On a real PostgreSQL. Each job is one step that waits 1 s on its model (a sleep: the worker is idle while
it waits, as it is on a real model call). Measured from the worker's JSON logs (first claim to last job
exit) and from the kernel
(peak RSS of each worker process, ``wait4``):

* throughput (jobs/s) at concurrency 50 vs 1; target >= 40x
* peak RSS of the concurrency-50 worker vs the concurrency-1 worker; target <= 2x
* memory per extra slot: (peak RSS at 50 - peak RSS at 1) / 49, reported

Why not 50x: the 50 jobs are one burst on one event loop. Each job costs that loop about 7 ms of its own
(measured: worker CPU of 100 jobs minus 50 at ``--concurrency 50``): its claim, boot and hydration (about
3 ms, before its model wait) and its checkpoint, delivery, status and journal close (about 4 ms, after).
The boots of a burst follow one another, so the last job starts about 0.1 s after the first claim, and the
ends pile up the same way: the span is about 1.2 s for 1 s of waiting, 40-43x on a 2-core machine shared
with the PostgreSQL server. The ideal 50x would need no per-job work on the loop at all.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import REPO, child_env, emit
from bench_worker import create_jobs, job_spans

from _pg import running_postgres


def run_worker(url: str, tmp: str, concurrency: int, jobs: int, model_seconds: float) -> tuple[float, float]:
    """(jobs/s, peak RSS in MiB) of one worker running ``jobs`` jobs at ``concurrency``."""
    asyncio.run(create_jobs(url, "model-bound", [f"c{concurrency}-{i:03d}" for i in range(jobs)]))
    env = child_env(
        AGENTLIFE_DATA_DIR=str(Path(tmp) / f"data-{concurrency}"),
        AGENTLIFE_HEALTH_PORT="off",
        AGENTLIFE_DATABASE_URL=url,
        BENCH_MODEL_SECONDS=str(model_seconds),
    )
    args = ["--concurrency", str(concurrency), "--max-jobs", str(jobs)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentlife", "worker", "bench_agents:ModelBoundAgent", *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"worker --concurrency {concurrency} exited {proc.returncode}")
    first, last = job_spans([out])
    return jobs / (last - first), usage.ru_maxrss / 1024  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--model-seconds", type=float, default=1.0)
    args = parser.parse_args()
    with running_postgres() as server, tempfile.TemporaryDirectory() as tmp:
        one, rss_one = run_worker(server.create_database("conc_one"), tmp, 1, args.jobs, args.model_seconds)
        url = server.create_database("conc_many")
        many, rss_many = run_worker(url, tmp, args.jobs, args.jobs, args.model_seconds)
    speedup = many / one
    emit(
        "concurrency",
        f"model-bound jobs/s: one worker at --concurrency {args.jobs} vs 1 ({args.jobs} jobs)",
        many,
        "jobs/s",
        baseline=one,
        target=">= 40x",
        ok=speedup >= 40,
    )
    emit(
        "concurrency",
        f"peak RSS: worker at --concurrency {args.jobs} vs 1",
        rss_many,
        "MiB",
        baseline=rss_one,
        target="<= 2x",
        ok=rss_many <= 2 * rss_one,
    )
    emit(
        "concurrency",
        "memory per extra slot (peak RSS growth / extra slots)",
        (rss_many - rss_one) / max(1, args.jobs - 1) * 1024,
        "KiB",
    )


if __name__ == "__main__":
    main()
