"""Durable sleeps end to end, with real processes only: ``python -m agentlife run`` and ``worker`` on SQLite
and PostgreSQL, SIGTERM and SIGKILL before, during and after the wait. The effects around a sleep happen
once, a long sleep frees the process (the row WAITING until its time), a short one gives way to a drain at
once, and the next attempt waits only for what is left."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

import world
from agentlife.stores import StepRecord, WaitState
from procs import REPO, wait_for, wait_for_handler

SLEEPER = "agents.wait_agent:Sleeper"


class World(world.World):
    """The waits' world: the sleeper and listener agents trace to it."""

    def __init__(self, tmp_path: Path, url: str, **env: str) -> None:
        super().__init__(tmp_path, url, trace_variable="WAIT_DIR", target=SLEEPER, **env)

    def wait(self, job_id: str) -> WaitState:
        return self.read(lambda store: store.get_wait(job_id))

    def records(self, job_id: str) -> list[StepRecord]:
        return self.read(lambda store: store.load_step_records(job_id))

    def create(self, job_id: str, agent: str = "sleeper") -> None:
        super().create(job_id, agent)

    def events(self, job_id: str, kind: str) -> list[dict[str, object]]:
        """Every ``kind`` event of the job's session journals on every pod, oldest session first."""
        found = []
        sessions = [path for d in self.session_dirs(job_id) for path in d.glob("session_*.jsonl")]
        for session in sorted(sessions, key=lambda path: path.name):
            for line in session.read_text().splitlines():
                event = orjson.loads(line)
                if event["type"] == kind:
                    found.append(event)
        return found

    def effects(self) -> tuple[list[str], list[str]]:
        """The invocation ids of the effects before and after the sleep, one per time each ran."""
        return [x.split()[0] for x in self.lines("before")], [x.split()[0] for x in self.lines("after")]

    def assert_effects_under_kills(self, before: str, after: str, outcomes: list[int]) -> None:
        """Each effect ran under its one invocation id, again only after a SIGKILL (at most once per kill).

        The tools have no verify: a SIGKILL between an effect and the journal's record of it reruns the
        effect (at-least-once, as documented). A drain, a park or a resume never runs one twice.
        """
        kills = outcomes.count(-signal.SIGKILL)
        for ran, expected in zip(self.effects(), (before, after), strict=True):
            assert ran[:1] == [expected] and set(ran) == {expected}, (ran, outcomes)
            assert len(ran) <= 1 + kills, (ran, outcomes)


def test_a_long_sleep_parks_the_job_waiting_and_runs_on_other_pods_park_it_again_until_the_same_end(
    tmp_path: Path, db_url: str
) -> None:
    world = World(tmp_path, db_url, AGENTLIFE_PARK_AFTER_SECONDS="0.5", WAIT_SECONDS="120")
    world.create("job-1")
    started = time.time()
    code, out = world.finish(world.run("job-1"))
    assert code == 0, out  # the process is free while the job sleeps
    assert world.row("job-1").status == "WAITING"
    wait = world.wait("job-1")
    assert wait.until is not None and wait.until >= started + 120 - 0.5  # the row says when the wait ends
    assert wait.waiting_for["invocation_id"] == "job-1/0/1"
    listed = world.job("list", "--status", "WAITING")
    assert listed.returncode == 0 and "job-1" in listed.stdout, listed.stderr
    shown = world.job("show", "job-1")
    assert shown.returncode == 0, shown.stderr
    assert "  status      WAITING\n" in shown.stdout and "  waits for   sleep until " in shown.stdout
    assert shown.stdout.count("(job-1/0/1)") == 1, shown.stdout
    # Too early, each on another pod (its own empty disk): the resumed step reaches the wait again and parks
    # again until the same end, nothing run twice. (Resuming on time, on another pod: the worker test next.)
    for attempt, pod in ((2, "b"), (3, "c")):
        code, out = world.finish(world.run("job-1", AGENTLIFE_ATTEMPT=str(attempt), pod=pod))
        assert code == 0, out
        assert world.row("job-1").status == "WAITING"
        assert world.wait("job-1").until == wait.until
    assert world.effects() == (["job-1/0/0"], [])
    [end] = {event["until"] for event in world.events("job-1", "WAIT_STARTED")}  # started once: the later
    assert abs(float(end) - wait.until) < 1e-3  # attempts waited for the recorded end (the row keeps us)


def test_a_worker_resumes_a_waiting_job_once_its_time_has_come(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    world = World(tmp_path, db_url, AGENTLIFE_PARK_AFTER_SECONDS="0.5", WAIT_SECONDS="7")
    world.create("job-1")
    code, out = world.finish(world.run("job-1"))
    assert code == 0 and world.row("job-1").status == "WAITING", out
    # A worker on another pod (an empty disk) resumes it, at the wait's recorded end.
    worker = subprocess.Popen(
        [sys.executable, "-m", "agentlife", "worker", SLEEPER, "--max-jobs", "1", "--idle-timeout", "60"],
        env=world.env(pod="worker"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    procs.append(worker)
    code, out = world.finish(worker, timeout=90)
    assert code == 0, out
    assert world.row("job-1").status == "COMPLETED", out
    assert world.effects() == (["job-1/0/0"], ["job-1/0/2"])
    row = world.row("job-1")
    assert row.attempt == 2 and row.error == []  # parked once and resumed once, no crash
    # Never before its time. How soon after is a store matter (test_pg_notify: the timer wakes the wait) and
    # a figure for the benchmarks, not a bound for a loaded machine.
    [started] = world.events("job-1", "WAIT_STARTED")[:1]
    assert {e["until"] for e in world.events("job-1", "WAIT_STARTED")} == {started["until"]}  # never anew
    [completed] = world.events("job-1", "WAIT_COMPLETED")
    assert float(completed["ts"]) >= float(started["until"])  # type: ignore[arg-type]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signal_during_a_short_sleep_leaves_the_next_attempt_only_what_is_left(
    tmp_path: Path, db_url: str, sig: signal.Signals
) -> None:
    world = World(tmp_path, db_url, WAIT_SECONDS="4")  # under park_after (30 s): waited in the process
    world.create("job-1")
    started = time.time()
    proc = world.run("job-1")
    wait_for(world.traces / "sleeping-1", timeout=60)
    wait_for_handler(proc)
    # The wait has begun once its start is in the store (written before the wait, with the journal's fsync);
    # a kill before that is a kill before the wait, which the next attempt rightly starts afresh.
    deadline = time.monotonic() + 60
    while b'"WAIT_STARTED"' not in b"".join(r.data for r in world.records("job-1")):
        assert time.monotonic() < deadline, "the wait's start never reached the store"
        time.sleep(0.05)
    proc.send_signal(sig)
    code, out = world.finish(proc)
    assert code == (143 if sig == signal.SIGTERM else -9), out
    assert world.effects() == (["job-1/0/0"], [])
    if sig == signal.SIGTERM:
        # The drain ended the wait at once: the row waits for the rest, the wait is in the journal.
        assert "drained during a wait" in out, out
        assert world.row("job-1").status == "WAITING"
    code, out = world.finish(world.run("job-1", AGENTLIFE_ATTEMPT="2", pod="b"))  # on another pod
    assert code == 0, out
    assert time.time() >= started + 4  # the sleep was not cut short ...
    assert world.effects() == (["job-1/0/0"], ["job-1/0/2"])  # ... and nothing ran twice
    ends = {event["until"] for event in world.events("job-1", "WAIT_STARTED")}
    assert len(ends) == 1  # ... and it was not started afresh: only what was left was waited for
    row = world.row("job-1")
    assert row.status == "COMPLETED", row


def test_sleep_until_a_past_time_returns_at_once_and_the_job_finishes(tmp_path: Path, db_url: str) -> None:
    world = World(tmp_path, db_url, WAIT_UNTIL=str(time.time() - 60))
    world.create("job-1")
    code, out = world.finish(world.run("job-1"))
    assert code == 0, out
    assert world.row("job-1").status == "COMPLETED"
    assert world.effects() == (["job-1/0/0"], ["job-1/0/2"])


@pytest.mark.parametrize(
    ("seconds", "needle"),
    [
        ("-1", "got -1.0"),
        ("nan", "got nan"),
        ("inf", "got inf"),
        ("1e300", "got 1e+300"),
    ],
)
def test_a_sleep_of_a_bad_duration_fails_the_step_with_one_clear_error(
    tmp_path: Path, seconds: str, needle: str
) -> None:
    world = World(tmp_path, f"sqlite:///{tmp_path / 'agentlife.db'}", WAIT_SECONDS=seconds)
    world.create("job-1")
    code, out = world.finish(world.run("job-1"))
    assert code == 1, out
    assert "ctx.sleep: seconds must be a finite number from 0 to 1e+09, " + needle in out, out
    assert world.effects() == (["job-1/0/0"], [])  # the effect before it happened once and is kept
    assert world.events("job-1", "WAIT_STARTED") == []


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.exhaustive)])
def test_random_kills_and_drains_around_a_parked_sleep_leave_every_effect_once(
    tmp_path: Path, db_url: str, seed: int
) -> None:
    # Seeded: SIGKILL or SIGTERM at a random moment of each attempt (booting, before the wait's start is
    # journaled, parking, or after), until an attempt runs to its end. The sleep parks (1.5 s > 0.3 s).
    import random

    rng = random.Random(seed)
    # Each attempt runs on the first pod's disk or on a new one, as a fleet would place it.
    world = World(tmp_path, db_url, AGENTLIFE_PARK_AFTER_SECONDS="0.3", WAIT_SECONDS="1.5")
    world.create("job-1")
    attempt, outcomes = 0, []
    while world.row("job-1").status != "COMPLETED":
        attempt += 1
        assert attempt < 40, outcomes
        pod = rng.choice([None, str(attempt)])
        proc = world.run("job-1", AGENTLIFE_ATTEMPT=str(attempt), pod=pod)
        if attempt <= 6:
            time.sleep(rng.uniform(0.0, 1.2))
            proc.send_signal(rng.choice([signal.SIGKILL, signal.SIGTERM]))
        code, out = world.finish(proc)
        # -15: a SIGTERM before the handler was installed (interpreter start) killed it like a SIGKILL.
        assert code in (0, 143, -9, -15), out  # never a crash: done, parked, drained or killed
        outcomes.append(code)
        if code == 0 and world.row("job-1").status == "WAITING":
            time.sleep(0.3)  # parked: the next run is early (parks again) or on time
    world.assert_effects_under_kills("job-1/0/0", "job-1/0/2", outcomes)
    assert len({event["until"] for event in world.events("job-1", "WAIT_STARTED")}) == 1, outcomes
    assert world.row("job-1").result == {"slept": True}
