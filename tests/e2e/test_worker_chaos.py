"""A pool of real workers on a real PostgreSQL under seeded SIGKILLs and SIGTERMs, restarted as a Deployment
would restart them, each process on a disk of its own (a new pod): every job ends COMPLETED, every side effect
happens exactly once, no job is ever run by two live processes at once (the journals and the fsynced step
traces say when each attempt ran, and where), and the jobs of killed workers are reclaimed by the reapers of
the surviving or respawned workers, never before their heartbeat is older than the threshold unless their
owner is known to be gone. One of the faults kills every live worker at once.

How long a reclaim takes is a figure, not an assertion: it depends on how fast a respawned worker boots on
a loaded machine, which no code here bounds. The test prints its p50, p99 and max (``-s``); docs/workers.md
gives the bound and the figures of the 300-job run.

The second test does the same with concurrent workers (``--concurrency``) running a tool-using agent whose
side effects go through ``verify``, against the fake Anthropic server (a process of its own) answering
after a latency; it also checks from the journals that no attempt overlapped another and that every drain
ended with 143 inside the grace period.

Sizes come from the environment, so the nox ``chaos`` session runs the big variant: ``WORKER_CHAOS_JOBS``
(default 30; 16 for the concurrent test), ``WORKER_CHAOS_SIGKILLS`` (3; 2), ``WORKER_CHAOS_SIGTERMS`` (3;
2), ``WORKER_CHAOS_WORKERS`` (3; 3), ``WORKER_CHAOS_SEED`` (15), ``WORKER_CHAOS_CONCURRENCY`` (4) and
``WORKER_CHAOS_LATENCY`` (0.05 s).
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
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import IO

import orjson
import pytest
from test_worker import TARGET, create_jobs, rows

from agentlife.constants import Constants
from agentlife.stores import JobStatus
from procs import REPO, agent_env

JOBS = int(os.environ.get("WORKER_CHAOS_JOBS", "30"))
SIGKILLS = int(os.environ.get("WORKER_CHAOS_SIGKILLS", "3"))
SIGTERMS = int(os.environ.get("WORKER_CHAOS_SIGTERMS", "3"))
WORKERS = int(os.environ.get("WORKER_CHAOS_WORKERS", "3"))
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
    """``workers`` slots, each respawned as soon as its process is gone, like a Deployment's ReplicaSet.

    Every process's exit is timed by a thread waiting on it, so a drain's length is measured from the
    signal to the exit, not to the next poll.
    """

    def __init__(
        self,
        env: dict[str, str],
        logs: Path,
        *,
        workers: int = WORKERS,
        target: str = TARGET,
        args: tuple[str, ...] = ("--time-scale", str(TIME_SCALE)),
    ) -> None:
        self.env, self.logs, self.target, self.args = env, logs, target, args
        self.slots: list[tuple[subprocess.Popen[bytes], IO[bytes]] | None] = [None] * workers
        self.spawned = 0
        self.exit_codes: list[int] = []
        #: pid -> time.monotonic() of its exit.
        self.exited_at: dict[int, float] = {}
        #: pid -> (signal, time.monotonic()) of the first signal sent to it.
        self.signalled: dict[int, tuple[int, float]] = {}
        self.processes: list[subprocess.Popen[bytes]] = []
        self.waiters: list[threading.Thread] = []

    def keep_up(self) -> None:
        for i, slot in enumerate(self.slots):
            if slot is not None and slot[0].poll() is None:
                continue
            if slot is not None:
                self.exit_codes.append(slot[0].returncode)
                slot[1].close()
            log = (self.logs / f"worker-{self.spawned:04d}.log").open("wb")
            command = [sys.executable, "-m", "agentlife", "worker", self.target, *self.args]
            # Each process on a disk of its own, as a new pod: what a job resumed elsewhere replays comes
            # from the store.
            disk = Path(self.env["AGENTLIFE_DATA_DIR"]) / f"pod-{self.spawned:04d}"
            proc = subprocess.Popen(
                as_pod(f"pod-{i}", command),
                env={**self.env, "AGENTLIFE_DATA_DIR": str(disk)},
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            self.spawned += 1
            self.slots[i] = (proc, log)
            self.processes.append(proc)
            waiter = threading.Thread(target=self._time_exit, args=(proc,), daemon=True)
            waiter.start()
            self.waiters.append(waiter)

    def _time_exit(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        self.exited_at[proc.pid] = time.monotonic()

    def live(self) -> list[subprocess.Popen[bytes]]:
        return [slot[0] for slot in self.slots if slot is not None and slot[0].poll() is None]

    def ready(self, proc: subprocess.Popen[bytes]) -> bool:
        """Whether the worker logged that it is taking jobs."""
        index = self.processes.index(proc)
        return b"worker ready" in (self.logs / f"worker-{index:04d}.log").read_bytes()

    def signal(self, proc: subprocess.Popen[bytes], sig: int) -> None:
        self.signalled.setdefault(proc.pid, (sig, time.monotonic()))
        proc.send_signal(sig)

    def drains(self) -> list[tuple[int, float]]:
        """(exit code, seconds from SIGTERM to exit) of every process whose first signal was SIGTERM and
        which no SIGKILL reached (the one that kills the whole pool may come during a drain)."""
        out = []
        for proc in self.processes:
            sig, at = self.signalled.get(proc.pid, (0, 0.0))
            if sig == signal.SIGTERM and proc.returncode != -signal.SIGKILL:
                out.append((proc.returncode, self.exited_at[proc.pid] - at))
        return out

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
        for waiter in self.waiters:
            waiter.join(timeout=10)


@pytest.mark.slow(15)
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
    # The first workers boot: faults start once a job runs. After a fixed second instead, a loaded machine's
    # slow boots met every kill, no job was running in a killed worker and no reaper had anything to take.
    while not (traces / "steps").exists() or not (traces / "steps").stat().st_size:
        assert time.monotonic() < deadline, "no worker ran a step"
        pool.keep_up()
        time.sleep(0.05)
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
    spans = attempt_spans(tmp_path / "data", traces / "steps")
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


def attempt_spans(disks: Path, steps: Path | None) -> dict[str, dict[int, tuple[float, float, set[int]]]]:
    """Per job and attempt: (first, last) unix time seen in its journals (on every pod's disk under
    ``disks``) and step traces, and its pids."""
    spans: dict[str, dict[int, tuple[float, float, set[int]]]] = defaultdict(dict)

    def see(job_id: str, attempt: int, ts: float, pid: int | None) -> None:
        start, end, pids = spans[job_id].get(attempt, (ts, ts, set()))
        if pid is not None:
            pids.add(pid)
        spans[job_id][attempt] = (min(start, ts), max(end, ts), pids)

    for job_dir in (d for sessions in disks.glob("pod-*/sessions") for d in sessions.iterdir()):
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
    for line in steps.read_text().splitlines() if steps is not None else []:
        job_id, attempt, _, pid, _, _, ts = line.split()
        see(job_id, int(attempt), float(ts), int(pid))
    return spans


# -- concurrent workers running a tool-using agent against a slow model ----------------------------------

#: Jobs per worker process at once (``--concurrency``).
CONCURRENCY = int(os.environ.get("WORKER_CHAOS_CONCURRENCY", "4"))
#: Seconds the fake model server waits before each answer.
LATENCY = float(os.environ.get("WORKER_CHAOS_LATENCY", "0.05"))
POOL_JOBS = int(os.environ.get("WORKER_CHAOS_JOBS", "16"))
POOL_SIGKILLS = int(os.environ.get("WORKER_CHAOS_SIGKILLS", "2"))
POOL_SIGTERMS = int(os.environ.get("WORKER_CHAOS_SIGTERMS", "2"))
POOL_WORKERS = int(os.environ.get("WORKER_CHAOS_WORKERS", "3"))
#: x 0.02: the 65 s grace period is 1.3 s (step deadline 0.9 s, cleanup 0.2 s), the reaper threshold 6 s,
#: the job heartbeat 0.6 s. A drain must end inside the grace period; `DRAIN_MARGIN` is for a process
#: waiting for a core on a loaded machine, not for the code.
POOL_TIME_SCALE = 0.02
POOL_CONSTANTS = Constants().scaled(POOL_TIME_SCALE)
GRACE = POOL_CONSTANTS.drain.termination_grace_seconds
DRAIN_MARGIN = 1.0
TOOL_TARGET = "agents.chaos_tool_agent:ChaosToolAgent"


def start_fake_model(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """The fake Anthropic server as a process of its own, answering every job's turns by step and call."""
    from agents.chaos_tool_agent import script

    path = tmp_path / "script.json"
    path.write_bytes(orjson.dumps(script(LATENCY)))
    server = subprocess.Popen(
        [sys.executable, "-m", "agentlife.testing", "fake-anthropic", "--script", str(path)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert server.stdout is not None
    return server, server.stdout.readline().strip()


@pytest.mark.slow(45)
def test_concurrent_workers_running_a_tool_agent_survive_seeded_kills_with_every_effect_once(
    tmp_path: Path, postgres_url: str
) -> None:
    from agents.chaos_tool_agent import TURNS, ChaosToolAgent

    traces, logs = tmp_path / "traces", tmp_path / "logs"
    traces.mkdir()
    logs.mkdir()
    base = agent_env(tmp_path / "data", WORKER_DIR=str(traces), AGENTLIFE_HEALTH_PORT="off")
    server, model_url = start_fake_model(tmp_path, base)
    env = {
        **base,
        "AGENTLIFE_DATABASE_URL": postgres_url,
        "ANTHROPIC_API_KEY": "test-key",
        "ANTHROPIC_BASE_URL": model_url,
        "AGENTLIFE_PROBE_LAG_INTERVAL_SECONDS": "10",
        "AGENTLIFE_PROBE_BLOCKED_THRESHOLD_SECONDS": "25",
    }
    ids = [f"tool-{i:04d}" for i in range(POOL_JOBS)]
    create_jobs(postgres_url, *ids, agent=ChaosToolAgent.agent_id)
    rng = random.Random(SEED)
    events = [signal.SIGKILL] * POOL_SIGKILLS + [signal.SIGTERM] * POOL_SIGTERMS
    rng.shuffle(events)
    events.insert(rng.randrange(len(events) + 1), EVERY_WORKER)
    args = ("--time-scale", str(POOL_TIME_SCALE), "--concurrency", str(CONCURRENCY))
    pool = Pool(env, logs, workers=POOL_WORKERS, target=TOOL_TARGET, args=args)
    started = time.monotonic()
    deadline = started + 90 + POOL_JOBS * 0.5
    pool.keep_up()
    time.sleep(1.0)  # the first workers boot
    next_event = time.monotonic() + rng.uniform(0.1, 0.4)
    try:
        while True:
            pool.keep_up()
            now = time.monotonic()
            if events and now >= next_event:
                fire(pool, events, rng)
                next_event = now + rng.uniform(0.1, 0.4)
            if not events and all(r.status == JobStatus.COMPLETED for r in rows(postgres_url).values()):
                break
            assert now < deadline, (
                f"not done in time: {sorted(r.status for r in rows(postgres_url).values())}"
            )
            time.sleep(0.05)
    finally:
        pool.stop()
        server.terminate()
        server.communicate(timeout=20)
    took = time.monotonic() - started

    signals = [sig for sig, _ in pool.signalled.values()]
    assert signals.count(signal.SIGKILL) >= POOL_SIGKILLS  # the whole pool's kill adds one per live worker
    assert signals.count(signal.SIGTERM) == POOL_SIGTERMS
    final = rows(postgres_url)
    assert {job_id: final[job_id].status for job_id in ids} == dict.fromkeys(ids, JobStatus.COMPLETED)

    # Every side effect exactly once: one per tool turn of every job, no invocation twice.
    effects = [line.split() for line in (traces / "effects").read_text().splitlines()]
    invocations = [e[0] for e in effects]
    assert len(invocations) == len(set(invocations)), "a side effect ran twice"
    per_job: dict[str, int] = defaultdict(int)
    for effect in effects:
        per_job[effect[1]] += 1
    assert per_job == dict.fromkeys(ids, TURNS - 1)

    # No attempt overlapped another: each in one process, the next begun after the last ended (journals).
    spans = attempt_spans(tmp_path / "data", None)
    overlapping = jobs_with_overlapping_attempts(spans, ids)
    assert not overlapping, overlapping
    # Several jobs at once in one process: the concurrency was real.
    assert max(concurrent_jobs(spans).values()) > 1

    # Every drain ended inside the grace period, with 143 (a job's step cancelled at its deadline at worst).
    drains = pool.drains()
    assert len(drains) >= 1
    assert all(code == 143 for code, _ in drains), drains
    longest = max(seconds for _, seconds in drains)
    assert longest <= GRACE + DRAIN_MARGIN, f"a drain took {longest:.2f} s (grace {GRACE:g} s)"
    reaped = [
        e for r in final.values() for e in r.error if e.get("error_class") in ("HeartbeatStale", "OwnerGone")
    ]
    print(
        f"\nchaos pool: {POOL_JOBS} jobs of a tool agent, {POOL_WORKERS} workers x --concurrency "
        f"{CONCURRENCY}, model latency {LATENCY:g} s, {signals.count(signal.SIGKILL)} SIGKILL "
        f"({POOL_SIGKILLS} + the whole pool once) + {POOL_SIGTERMS} SIGTERM, {pool.spawned} workers, "
        f"{len(reaped)} reaped, {len(effects)} effects, {sum(len(a) for a in spans.values())} attempts, "
        f"drains {percentiles([s for _, s in drains])} (grace {GRACE:g} s), {took:.1f} s"
    )


def fire(pool: Pool, events: list[int], rng: random.Random) -> None:
    """Send the next fault: to one live worker not yet signalled (busy first), or to the whole pool."""
    if events[-1] == EVERY_WORKER:
        everyone = pool.live()
        if len(everyone) == len(pool.slots):  # else wait for the respawns: the whole pool, no reaper left
            events.pop()
            for victim in everyone:
                pool.signal(victim, signal.SIGKILL)
        return
    candidates = [proc for proc in pool.live() if proc.pid not in pool.signalled]
    if events[-1] == signal.SIGTERM:
        # A SIGTERM before the interpreter has installed any handler kills with the default action (-15),
        # as it would a container in its first milliseconds: a drain needs a worker that is up.
        candidates = [proc for proc in candidates if pool.ready(proc)]
    if candidates:
        pool.signal(rng.choice(candidates), events.pop())


def jobs_with_overlapping_attempts(
    spans: dict[str, dict[int, tuple[float, float, set[int]]]], ids: list[str]
) -> list[str]:
    """The jobs an attempt of which ran in two processes, or began before the one before it ended."""
    bad = []
    for job_id in ids:
        attempts = sorted(spans[job_id].items())
        if any(len(pids) != 1 for _, (_, _, pids) in attempts) or any(
            end1 > start2 for (_, (_, end1, _)), (_, (start2, _, _)) in itertools.pairwise(attempts)
        ):
            bad.append(f"{job_id}: {attempts}")
    return bad


def concurrent_jobs(spans: dict[str, dict[int, tuple[float, float, set[int]]]]) -> dict[int, int]:
    """Per process, the most attempts it ran at the same time."""
    edges: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for attempts in spans.values():
        for start, end, pids in attempts.values():
            for pid in pids:
                edges[pid] += [(start, 1), (end, -1)]
    most: dict[int, int] = {}
    for pid, points in edges.items():
        running = peak = 0
        for _, step in sorted(points, key=lambda p: (p[0], p[1])):
            running += step
            peak = max(peak, running)
        most[pid] = peak
    return most
