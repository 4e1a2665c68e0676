"""A pool of real workers on a real PostgreSQL under seeded SIGKILLs and SIGTERMs, restarted as a Deployment
would restart them: every job ends COMPLETED, every side effect happens exactly once, no job is ever run by
two live processes at once (the journals and the fsynced step traces say when each attempt ran, and where),
and the jobs of killed workers are reclaimed by the reapers of the surviving or respawned workers, never
before their heartbeat is older than the threshold unless their owner is known to be gone. One of the faults
kills every live worker at once.

How long a reclaim takes is a figure, not an assertion: it depends on how fast a respawned worker boots on
a loaded machine, which no code here bounds. The test prints its p50, p99 and max (``-s``); docs/workers.md
gives the bound and the figures of the 300-job run.

Sizes come from the environment, so the nox ``chaos`` session runs the big variant: ``WORKER_CHAOS_JOBS``
(default 60), ``WORKER_CHAOS_SIGKILLS`` (8), ``WORKER_CHAOS_SIGTERMS`` (8), ``WORKER_CHAOS_WORKERS`` (4),
``WORKER_CHAOS_SEED`` (15).
"""

from __future__ import annotations

import itertools
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import IO

import orjson

from agentlife.constants import Constants
from agentlife.stores import JobStatus
from procs import REPO, agent_env
from test_worker import TARGET, create_jobs, rows

JOBS = int(os.environ.get("WORKER_CHAOS_JOBS", "60"))
SIGKILLS = int(os.environ.get("WORKER_CHAOS_SIGKILLS", "8"))
SIGTERMS = int(os.environ.get("WORKER_CHAOS_SIGTERMS", "8"))
WORKERS = int(os.environ.get("WORKER_CHAOS_WORKERS", "4"))
SEED = int(os.environ.get("WORKER_CHAOS_SEED", "15"))
STEPS = 3
#: Every duration of the constants x 0.005: the 300 s reaper threshold is 1.5 s, its period 0.3 s, the
#: 30 s job heartbeat 0.15 s, the 45 s drain step deadline 0.225 s.
TIME_SCALE = 0.005
CONSTANTS = Constants().scaled(TIME_SCALE)
THRESHOLD = CONSTANTS.heartbeat.zombie_after_seconds
REAP_PERIOD = THRESHOLD / 5
#: The fault that SIGKILLs every live worker at once (the others are one signal to one worker).
EVERY_WORKER = 0


def _can_name_hosts() -> bool:
    """Whether workers can get hostnames of their own (a UTS namespace each: root, util-linux unshare)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--uts", "hostname", "pod-probe"], capture_output=True, check=False)
    return probe.returncode == 0


NAMED_HOSTS = _can_name_hosts()


def as_pod(hostname: str, command: list[str]) -> list[str]:
    """``command`` on its own hostname, as in a pod: a worker respawned in the same slot is a container
    restarted in place (its reaper sees its predecessor's process gone), the other slots are other pods (they
    can only judge a dead worker by its heartbeat's age). Same pid: ``unshare`` and ``sh`` exec."""
    if not NAMED_HOSTS:
        return command
    return ["unshare", "--uts", "sh", "-c", f'hostname {hostname} && exec "$@"', "sh", *command]


class Pool:
    """``WORKERS`` slots, each respawned as soon as its process is gone, like a Deployment's ReplicaSet."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.slots: list[tuple[subprocess.Popen[bytes], IO[bytes]] | None] = [None] * WORKERS
        self.spawned = 0
        self.exit_codes: list[int] = []

    def keep_up(self) -> None:
        for i, slot in enumerate(self.slots):
            if slot is not None and slot[0].poll() is None:
                continue
            if slot is not None:
                self.exit_codes.append(slot[0].returncode)
                slot[1].close()
            log = (self.logs / f"worker-{self.spawned:04d}.log").open("wb")
            self.spawned += 1
            command = [sys.executable, "-m", "agentlife", "worker", TARGET, "--time-scale", str(TIME_SCALE)]
            proc = subprocess.Popen(
                as_pod(f"pod-{i}", command),
                env=self.env,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            self.slots[i] = (proc, log)

    def live(self) -> list[subprocess.Popen[bytes]]:
        return [slot[0] for slot in self.slots if slot is not None and slot[0].poll() is None]

    def stop(self) -> None:
        for slot in self.slots:
            if slot is not None and slot[0].poll() is None:
                slot[0].send_signal(signal.SIGTERM)
        for slot in self.slots:
            if slot is not None:
                try:
                    slot[0].wait(timeout=20)
                except subprocess.TimeoutExpired:
                    slot[0].kill()
                    slot[0].wait()
                self.exit_codes.append(slot[0].returncode)
                slot[1].close()


def test_a_worker_pool_survives_seeded_kills_with_every_job_done_once(
    tmp_path: Path, postgres_url: str
) -> None:
    traces, logs = tmp_path / "traces", tmp_path / "logs"
    traces.mkdir()
    logs.mkdir()
    env = agent_env(
        tmp_path / "data",
        WORKER_DIR=str(traces),
        WORKER_TOOL="1",
        WORKER_STEPS=str(STEPS),
        WORKER_STEP_SECONDS="0.05",
        AGENTLIFE_DATABASE_URL=postgres_url,
        # Scaled with the rest these would sample the loop every 5 ms in every process: keep them sane.
        AGENTLIFE_PROBE_LAG_INTERVAL_SECONDS="10",
        AGENTLIFE_PROBE_BLOCKED_THRESHOLD_SECONDS="25",
        AGENTLIFE_HEALTH_PORT="off",
    )
    ids = [f"job-{i:04d}" for i in range(JOBS)]
    create_jobs(postgres_url, *ids)
    rng = random.Random(SEED)
    events: list[int] = [signal.SIGKILL] * SIGKILLS + [signal.SIGTERM] * SIGTERMS
    rng.shuffle(events)
    events.insert(rng.randrange(len(events) + 1), EVERY_WORKER)
    pool = Pool(env, logs)
    sent: list[tuple[float, int, int]] = []
    deadline = time.monotonic() + 60 + JOBS * 0.5
    pool.keep_up()
    time.sleep(1.0)  # the first workers boot
    next_event = time.monotonic() + rng.uniform(0.1, 0.4)
    try:
        while True:
            pool.keep_up()
            now = time.monotonic()
            if events and now >= next_event:
                live = busy_first(pool.live(), traces / "steps")
                if events[-1] == EVERY_WORKER:
                    everyone = pool.live()
                    if len(everyone) == WORKERS:  # else wait for the respawns: the whole pool, no reaper left
                        events.pop()
                        for victim in everyone:
                            victim.send_signal(signal.SIGKILL)
                        sent += [(time.time(), victim.pid, EVERY_WORKER) for victim in everyone]
                elif live:
                    victim = rng.choice(live)
                    sig = events.pop()
                    victim.send_signal(sig)
                    sent.append((time.time(), victim.pid, sig))
                next_event = now + rng.uniform(0.1, 0.4)
            if not events:
                statuses = {r.status for r in rows(postgres_url).values()}
                if statuses <= {JobStatus.COMPLETED, JobStatus.DEAD_LETTER, JobStatus.FAILED}:
                    break
            assert now < deadline, (
                f"not done in time: {sorted(r.status for r in rows(postgres_url).values())}"
            )
            time.sleep(0.05)
    finally:
        pool.stop()

    # The faults really happened, while jobs were running.
    assert sum(1 for _, _, s in sent if s == signal.SIGKILL) == SIGKILLS
    assert sum(1 for _, _, s in sent if s == signal.SIGTERM) == SIGTERMS
    assert sum(1 for _, _, s in sent if s == EVERY_WORKER) == WORKERS
    final = rows(postgres_url)
    assert {job_id: final[job_id].status for job_id in ids} == dict.fromkeys(ids, JobStatus.COMPLETED)

    # Every side effect exactly once: one per step of every job, no invocation twice.
    effects = [line.split() for line in (traces / "effects").read_text().splitlines()]
    invocations = [e[0] for e in effects]
    assert len(invocations) == len(set(invocations)), "a side effect ran twice"
    per_job: dict[str, int] = defaultdict(int)
    for _, job_id, _, _ in effects:
        per_job[job_id] += 1
    assert per_job == dict.fromkeys(ids, STEPS)

    # No job ever ran in two live processes at once: each attempt in one process, attempts one after another.
    spans = attempt_spans(tmp_path / "data" / "sessions", traces / "steps")
    for job_id in ids:
        attempts = sorted(spans[job_id].items())
        for attempt, (_, _, pids) in attempts:
            assert len(pids) == 1, f"{job_id} attempt {attempt} ran in processes {pids}"
        for (a1, (_, end1, _)), (a2, (start2, _, _)) in itertools.pairwise(attempts):
            assert end1 <= start2, f"{job_id}: attempt {a2} started while attempt {a1} still ran"

    # The killed workers' jobs were reaped. The workers share this host, so most are taken back as soon as a
    # reaper sees their claiming process gone (OwnerGone); the rest once their heartbeat is older than the
    # threshold (HeartbeatStale), and never before.
    kinds = ("HeartbeatStale", "OwnerGone")
    reaped = [e for r in final.values() for e in r.error if e.get("error_class") in kinds]
    assert reaped, "no job was reclaimed by a reaper"
    waits = [e["at"] - e["heartbeat_at"] for e in reaped]
    stale = [w for e, w in zip(reaped, waits, strict=True) if e["error_class"] == "HeartbeatStale"]
    assert all(w >= THRESHOLD for w in stale)
    print(
        f"\nchaos: {JOBS} jobs, {SIGKILLS} SIGKILL + {SIGTERMS} SIGTERM + the whole pool at once, "
        f"{pool.spawned} worker processes, {len(reaped)} reaped ({len(stale)} by heartbeat age, "
        f"{len(reaped) - len(stale)} owner gone); heartbeat age at reap: {percentiles(waits)}; "
        f"by heartbeat age: {percentiles(stale)}; threshold {THRESHOLD:g} s + period {REAP_PERIOD:g} s"
    )


def percentiles(values: list[float]) -> str:
    """p50, p99 and max of ``values`` in seconds (nearest rank), or "none"."""
    if not values:
        return "none"
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    return f"p50 {rank(0.5):.2f} s, p99 {rank(0.99):.2f} s, max {ordered[-1]:.2f} s (n={len(ordered)})"


def busy_first(live: list[subprocess.Popen[bytes]], steps: Path) -> list[subprocess.Popen[bytes]]:
    """The live workers that ran a step in the last 0.3 s (a kill then lands mid-job), else all of them."""
    recent: set[int] = set()
    if steps.exists():
        now = time.time()
        for line in steps.read_text().splitlines()[-40:]:
            fields = line.split()
            if len(fields) == 7 and now - float(fields[6]) < 0.3:
                recent.add(int(fields[3]))
    busy = [proc for proc in live if proc.pid in recent]
    return busy or live


def attempt_spans(sessions: Path, steps: Path) -> dict[str, dict[int, tuple[float, float, set[int]]]]:
    """Per job and attempt: (first, last) unix time seen in its journal and step traces, and its pids."""
    spans: dict[str, dict[int, tuple[float, float, set[int]]]] = defaultdict(dict)

    def see(job_id: str, attempt: int, ts: float, pid: int | None) -> None:
        start, end, pids = spans[job_id].get(attempt, (ts, ts, set()))
        if pid is not None:
            pids.add(pid)
        spans[job_id][attempt] = (min(start, ts), max(end, ts), pids)

    for job_dir in sessions.iterdir():
        for path in job_dir.glob("session_*.jsonl"):
            records = []
            for line in path.read_bytes().splitlines():
                try:
                    records.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    continue  # the line a SIGKILL cut short
            if not records or records[0].get("type") != "SESSION_STARTED":
                continue
            first = records[0]
            for record in records:
                see(job_dir.name, int(first["attempt"]), float(record["ts"]), int(first["pid"]))
    for line in steps.read_text().splitlines():
        job_id, attempt, _, pid, _, _, ts = line.split()
        see(job_id, int(attempt), float(ts), int(pid))
    return spans
