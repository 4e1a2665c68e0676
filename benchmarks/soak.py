"""Soak: long-lived agents and a stream of short jobs on two cores; RSS and fds must not grow.

Run by ``nox -s soak``.

What runs at once, for ``--minutes`` (default 3), against a real PostgreSQL:

* two long-lived agent processes (`chaos_agents.SoakAgent`, a job that never ends), each step an LLM call,
  a write-ahead journaled side-effecting tool and a checkpoint: one with the scripted in-process LLM, one
  through the real ``anthropic`` SDK against a `FakeAnthropicServer` here; both stream SSE heartbeats to a
  `ControlPlaneStub` that is stopped and restarted every 20 s, so heartbeat reconnects happen all along;
* a sequence of short jobs (`chaos_agents.ChaosAgent`, 20 steps each, one process after another).

Every second the long-lived processes are sampled through ``/proc/<pid>``: RSS (``VmRSS``), open file
descriptors (``fd/``) and threads; the job rows give the steps completed. The first ``WARMUP`` of the run is
left out (imports, first connections, allocator arenas filling up); over the rest a least-squares slope is
fitted, and the growth is the median of the last fifth of the samples minus the median of the first fifth.
Short jobs are judged across the sequence: each job's peak RSS and fds, and its duration.

Thresholds (a process fails the soak beyond them):

* RSS: growth ≤ `RSS_GROWTH_MB` (4 MiB) and slope ≤ `RSS_SLOPE_MB_PER_MIN` (1 MiB/min). A pod's memory
  limit is typically 512 MiB with ~300 MiB of headroom over an agent's working set; a job may run for hours
  (the idle timeout alone is 30 min). 1 MiB/min is 60 MiB an hour: a leak at that rate would OOM-kill a
  long job within a working day, so anything above it is a defect; below it, the 2-3 minutes of a soak
  cannot tell a leak from allocator noise (arenas and freelists settle in ~1 MiB steps), which is also
  why the absolute growth allows 4 MiB.
* fds and threads: growth ≤ 2 (a connection being replaced while sampled) and no upward trend: every fd a
  step or a reconnect opens must be closed; one leaked fd per reconnect would show here within minutes.
* short jobs: the last fifth's median peak RSS within 4 MiB of the first fifth's, fds within 2.

Writes ``bench-results/soak.md`` and exits 1 when a threshold is crossed or an agent misbehaves.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import orjson

REPO = Path(__file__).resolve().parent.parent
for _path in (REPO / "tests", REPO / "benchmarks", REPO / "src"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from _common import child_env  # noqa: E402
from chaos import SCALED_ENV  # noqa: E402

from _pg import running_postgres  # noqa: E402

WARMUP = 0.25  # fraction of the run left out of the fit
RSS_GROWTH_MB = 4.0
RSS_SLOPE_MB_PER_MIN = 1.0
COUNT_GROWTH = 2
SHORT_JOB_STEPS = 20
PLANE_RESTART_EVERY = 20.0


@dataclass(slots=True)
class Sample:
    at: float
    rss_mb: float
    fds: int
    threads: int
    steps: int


@dataclass(slots=True)
class LongLived:
    name: str
    job_id: str
    process: anyio.abc.Process | None = None
    samples: list[Sample] = field(default_factory=list)
    exit_code: int | None = None
    drain_seconds: float | None = None


@dataclass(slots=True)
class ShortJob:
    job_id: str
    seconds: float
    exit_code: int | None
    peak_rss_mb: float
    peak_fds: int


def proc_sample(pid: int) -> tuple[float, int, int] | None:
    """(RSS MiB, open fds, threads) of ``pid`` from /proc, or None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kb = int(fields.get("VmRSS", "0 kB").split()[0])
    return rss_kb / 1024, fds, int(fields.get("Threads", "0"))


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute."""
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def fifths(values: list[float]) -> str:
    """The medians of the five fifths of ``values``: the shape of a curve in one cell."""
    k = max(1, len(values) // 5)
    return " → ".join(
        f"{statistics.median(values[i * k : (i + 1) * k] or values[-k:]):.1f}" for i in range(5)
    )


def growth(values: list[float]) -> float:
    """Median of the last fifth minus median of the first fifth."""
    if len(values) < 5:
        return 0.0
    k = max(1, len(values) // 5)
    return statistics.median(values[-k:]) - statistics.median(values[:k])


class Soak:
    def __init__(self, minutes: float, url: str, work: Path) -> None:
        self.seconds = minutes * 60
        self.url = url
        self.work = work
        self.started = time.monotonic()
        self.long = [
            LongLived("scripted LLM", "soak-long-scripted"),
            LongLived("anthropic SDK", "soak-long-sdk"),
        ]
        self.short: list[ShortJob] = []
        self.plane_restarts = 0
        self.sampling = True
        self.heartbeats = 0

    def env(self, job_id: str, **extra: str) -> dict[str, str]:
        (self.work / job_id).mkdir(parents=True, exist_ok=True)
        return child_env(
            **SCALED_ENV,
            AGENTLIFE_JOB_ID=job_id,
            AGENTLIFE_DATA_DIR=str(self.work / job_id / "data"),
            AGENTLIFE_DATABASE_URL=self.url,
            AGENTLIFE_HEALTH_HOST="127.0.0.1",
            AGENTLIFE_HEALTH_PORT="0",
            AGENTLIFE_LOG_LEVEL="WARNING",
            CHAOS_DIR=str(self.work / job_id),
            PYTHONUNBUFFERED="1",
            **extra,
        )

    async def run(self) -> None:
        from agentlife.testing import ControlPlaneStub, FakeAnthropicServer

        async with ControlPlaneStub(token="soak-token") as plane, FakeAnthropicServer() as llm:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._top_up, llm)
                tg.start_soon(self._restart_plane, plane)
                plane_env = {
                    "AGENTLIFE_CONTROL_PLANE_URL": plane.url,
                    "AGENTLIFE_CONTROL_PLANE_TOKEN": "soak-token",
                }
                sdk_env = {
                    "CHAOS_LLM": "anthropic",
                    "ANTHROPIC_API_KEY": "soak-key",
                    "ANTHROPIC_BASE_URL": llm.base_url,
                }
                for agent, extra in zip(self.long, ({}, sdk_env), strict=True):
                    await tg.start(self._run_long, agent, {**plane_env, **extra})
                tg.start_soon(self._sample)
                await self._short_jobs()
                self.sampling = False  # samples of a draining process would say nothing about steady state
                for agent in self.long:
                    await self._drain(agent)
                tg.cancel_scope.cancel()
            self.heartbeats = len(plane.events_of("heartbeat"))

    async def _top_up(self, llm: Any) -> None:
        from agentlife.testing import ScriptedTurn

        while True:
            if llm.pending < 200:
                llm.enqueue(*[ScriptedTurn.text("a streamed answer", chunks=3, delay=0.002)] * 200)
            await anyio.sleep(0.5)

    async def _restart_plane(self, plane: Any) -> None:
        while True:
            await anyio.sleep(PLANE_RESTART_EVERY)
            await plane.stop()
            await anyio.sleep(1.0)
            await plane.start()
            self.plane_restarts += 1

    async def _run_long(
        self, agent: LongLived, extra: dict[str, str], *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        env = self.env(agent.job_id, SOAK_STEP_PAUSE="0.02", **extra)
        command = [
            sys.executable, "-m", "agentlife", "run", "chaos_agents:SoakAgent",
            "--create-job", "--payload", orjson.dumps({"steps": 10**9}).decode(),
        ]  # fmt: skip
        log = (self.work / agent.job_id / "agent.log").open("wb")
        process = await anyio.open_process(
            command, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        agent.process = process
        task_status.started()
        with log:
            await process.wait()

    async def _sample(self) -> None:
        import asyncpg

        while True:
            steps: dict[str, int] = {}
            with contextlib.suppress(OSError, asyncpg.PostgresError, TimeoutError):
                conn = await asyncpg.connect(self.url, timeout=5)
                try:
                    for agent in self.long:
                        raw = await conn.fetchval("SELECT checkpoint FROM job WHERE id = $1", agent.job_id)
                        steps[agent.job_id] = int(orjson.loads(raw)["state"].get("count", 0)) if raw else 0
                finally:
                    await conn.close()
            now = time.monotonic() - self.started
            if not self.sampling:
                return
            for agent in self.long:
                if agent.process is None or agent.process.returncode is not None:
                    continue
                got = proc_sample(agent.process.pid)
                if got is not None:
                    rss, fds, threads = got
                    agent.samples.append(Sample(now, rss, fds, threads, steps.get(agent.job_id, -1)))
            await anyio.sleep(1.0)

    async def _short_jobs(self) -> None:
        index = 0
        while time.monotonic() - self.started < self.seconds:
            job_id = f"soak-short-{index:04d}"
            index += 1
            env = self.env(job_id)
            command = [
                sys.executable, "-m", "agentlife", "run", "chaos_agents:ChaosAgent",
                "--create-job", "--payload", orjson.dumps({"steps": SHORT_JOB_STEPS}).decode(),
            ]  # fmt: skip
            started = time.monotonic()
            peak_rss, peak_fds = 0.0, 0
            with (self.work / job_id / "agent.log").open("wb") as log:
                process = await anyio.open_process(
                    command, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
                async with process:
                    with anyio.move_on_after(60):
                        while process.returncode is None:
                            got = proc_sample(process.pid)
                            if got is not None:
                                peak_rss, peak_fds = max(peak_rss, got[0]), max(peak_fds, got[1])
                            with anyio.move_on_after(0.1):
                                await process.wait()
                    if process.returncode is None:
                        process.kill()
                        await process.wait()
            self.short.append(
                ShortJob(job_id, time.monotonic() - started, process.returncode, peak_rss, peak_fds)
            )

    async def _drain(self, agent: LongLived) -> None:
        process = agent.process
        if process is None or process.returncode is not None:
            agent.exit_code = None if process is None else process.returncode
            return
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        with anyio.move_on_after(30):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
        agent.drain_seconds = time.monotonic() - sent
        agent.exit_code = process.returncode


def judge(soak: Soak) -> tuple[str, list[str]]:
    failures: list[str] = []
    lines = [
        f"# Soak ({soak.seconds / 60:g} min, 2 long-lived agents + {len(soak.short)} short jobs in sequence, "
        f"{soak.plane_restarts} control-plane restarts, {soak.heartbeats} heartbeats received)",
        "",
        f"Samples every 1 s from /proc; the first {WARMUP:.0%} of each process's samples are warm-up and "
        "left out. Growth = median of the last fifth minus median of the first fifth; slope = least squares.",
        "",
        "| process | steps | steps/s | RSS by fifths of the window (MiB) | RSS growth | "
        "RSS slope (MiB/min) | bytes/step | fds start → end | fd growth | threads start → end | drain | "
        "exit |",
        "|---|---:|---:|---|---:|---:|---:|---|---:|---|---:|---:|",
    ]
    for agent in soak.long:
        with (soak.work / f"{agent.job_id}.samples.csv").open("w") as f:
            f.write("seconds,rss_mib,fds,threads,steps\n")
            f.writelines(f"{s.at:.1f},{s.rss_mb:.2f},{s.fds},{s.threads},{s.steps}\n" for s in agent.samples)
        samples = agent.samples[int(len(agent.samples) * WARMUP) :]
        if len(samples) < 10:
            failures.append(f"{agent.name}: only {len(samples)} samples after warm-up")
            continue
        rss = [s.rss_mb for s in samples]
        fds = [float(s.fds) for s in samples]
        threads = [float(s.threads) for s in samples]
        rss_growth, fd_growth, thread_growth = growth(rss), growth(fds), growth(threads)
        rss_slope = slope_per_minute([(s.at, s.rss_mb) for s in samples])
        fd_slope = slope_per_minute([(s.at, float(s.fds)) for s in samples])
        steps = samples[-1].steps - samples[0].steps
        span = samples[-1].at - samples[0].at
        per_step = rss_growth * 1_048_576 / steps if steps > 0 else float("nan")
        drain = f"{agent.drain_seconds:.2f} s" if agent.drain_seconds is not None else "-"
        lines.append(
            f"| {agent.name} | {samples[-1].steps} | {steps / span:.1f} | {fifths(rss)} | "
            f"{rss_growth:+.2f} MiB | {rss_slope:+.2f} | {per_step:+.0f} | {fds[0]:.0f} → {fds[-1]:.0f} | "
            f"{fd_growth:+.0f} (slope {fd_slope:+.2f}/min) | {threads[0]:.0f} → {threads[-1]:.0f} | "
            f"{drain} | {agent.exit_code} |"
        )
        if rss_growth > RSS_GROWTH_MB or rss_slope > RSS_SLOPE_MB_PER_MIN:
            failures.append(f"{agent.name}: RSS grew {rss_growth:+.2f} MiB (slope {rss_slope:+.2f} MiB/min)")
        if fd_growth > COUNT_GROWTH or thread_growth > COUNT_GROWTH:
            failures.append(f"{agent.name}: fds grew {fd_growth:+.0f}, threads {thread_growth:+.0f}")
        if steps <= 0:
            failures.append(f"{agent.name}: made no progress after warm-up")
        if agent.exit_code != 143:
            failures.append(f"{agent.name}: exit {agent.exit_code} after SIGTERM (expected 143)")
    short = soak.short
    if len(short) >= 5:
        rss = [j.peak_rss_mb for j in short]
        fds = [float(j.peak_fds) for j in short]
        secs = [j.seconds for j in short]
        xs = list(range(len(short)))
        k = max(1, len(short) // 5)
        lines += [
            "",
            "| short jobs in sequence | first fifth (median) | last fifth (median) | growth | "
            "slope per 100 jobs |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, values, unit in (("peak RSS", rss, "MiB"), ("peak fds", fds, ""), ("duration", secs, "s")):
            first, last = statistics.median(values[:k]), statistics.median(values[-k:])
            slope = slope_per_minute(list(zip(xs, values, strict=True))) / 60 * 100
            lines.append(
                f"| {name} | {first:.2f} {unit} | {last:.2f} {unit} | {last - first:+.2f} | {slope:+.3f} |"
            )
        if growth(rss) > RSS_GROWTH_MB or growth(fds) > COUNT_GROWTH:
            failures.append(f"short jobs: peak RSS grew {growth(rss):+.2f} MiB, fds {growth(fds):+.0f}")
        bad = [j for j in short if j.exit_code != 0]
        if bad:
            failures.append(
                f"short jobs: {len(bad)} did not exit 0 (first: {bad[0].job_id} exit {bad[0].exit_code})"
            )
    else:
        failures.append(f"only {len(short)} short jobs ran")
    lines += [
        "",
        f"Thresholds: RSS growth ≤ {RSS_GROWTH_MB:g} MiB and slope ≤ {RSS_SLOPE_MB_PER_MIN:g} MiB/min; "
        f"fd and thread growth ≤ {COUNT_GROWTH} (see the module docstring for why).",
    ]
    lines += ["", "Result: " + ("PASS" if not failures else "FAIL")] + [f"- {f}" for f in failures]
    return "\n".join(lines) + "\n", failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=3.0, help="how long to run (default 3)")
    parser.add_argument("--out", default=str(REPO / "bench-results" / "soak.md"), help="report file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="agentlife-soak-"))
    try:
        with running_postgres() as pg:
            url = pg.create_database("soak")
            subprocess.run(
                [sys.executable, "-m", "agentlife", "db", "init", "--database-url", url],
                env=child_env(), cwd=REPO, capture_output=True, check=True,
            )  # fmt: skip
            soak = Soak(args.minutes, url, work)
            anyio.run(soak.run)
        text, failures = judge(soak)
    finally:
        if args.keep:
            sys.stderr.write(f"soak: work directory kept at {work}\n")
        else:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    sys.stdout.write(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
