"""Child jobs end to end with real processes on SQLite and PostgreSQL: ``ctx.start_job`` and
``ctx.wait_for_jobs`` under SIGKILL and SIGTERM of the parent's worker before its row says WAITING, right
after, while it wakes, and of the child's worker while a child runs; each worker process on a disk of its
own (a new pod). Every side effect happens once, every
child is created once, and the parent ends with the right sum. Bad calls fail the step with one line and
leave nothing behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

import world
from procs import REPO

PARENT, CHILD = "agents.family_agent:Parent", "agents.family_agent:Child"
#: Every duration x 0.02: job heartbeat 0.6 s, park_after 0.6 s, drain step deadline 0.9 s.
SCALE = "0.02"


class World(world.World):
    """The family's world: the parent and child agents trace to it."""

    def __init__(self, tmp_path: Path, url: str, **env: str) -> None:
        super().__init__(tmp_path, url, trace_variable="FAMILY_DIR", target=PARENT, **env)
        self.slots: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.spawned = 0
        self.child_concurrency = "3"

    def worker(self, slot: str) -> subprocess.Popen[bytes]:
        """The live worker of ``slot`` (``parent`` or ``child``), started again if it is gone."""
        proc = self.slots.get(slot)
        if proc is None or proc.poll() is not None:
            more = ("--concurrency", self.child_concurrency)
            target, more = (PARENT, ()) if slot == "parent" else (CHILD, more)
            self.spawned += 1
            with (self.logs / f"{slot}-{self.spawned}.log").open("wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "agentlife", "worker", target, "--time-scale", SCALE, *more],
                    env=self.env(pod=f"{slot}-{self.spawned}", AGENTLIFE_HEALTH_PORT="off"),
                    cwd=REPO,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            self.slots[slot] = proc
        return proc

    def keep_up(self) -> None:
        for slot in ("parent", "child"):
            self.worker(slot)

    def until(self, done: object, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not callable(done) or not done():
            self.keep_up()
            assert time.monotonic() < deadline, self.tail()
            time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.slots.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def tail(self) -> str:
        return "\n".join(p.read_text()[-3000:] for p in sorted(self.logs.glob("*.log")))

    def effect_ids(self, name: str) -> list[str]:
        return sorted(line.split()[0] for line in self.lines(name))

    def journal(self, job_id: str) -> list[dict[str, object]]:
        events = []
        sessions = [path for d in self.session_dirs(job_id) for path in d.glob("session_*.jsonl")]
        for session in sorted(sessions, key=lambda path: path.name):
            for line in session.read_text().splitlines():
                try:
                    events.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    continue  # the line a SIGKILL cut short
        return events


@pytest.fixture
def family(tmp_path: Path, db_url: str) -> object:
    made: list[World] = []

    def make(**env: str) -> World:
        made.append(World(tmp_path, db_url, **env))
        return made[-1]

    yield make
    for w in made:
        w.stop()


def _kill_point(w: World, point: str, sig: int) -> None:
    """Send ``sig`` to the worker that matters at ``point``, once that point is reached."""
    if point == "before-waiting":  # the children started, the row still RUNNING: the parent pauses
        w.until(lambda: (w.traces / "started-1").exists())
        victim = w.worker("parent")
    elif point == "after-waiting":  # the row says WAITING (the children are held back by CHILD_PAUSE)
        w.until(lambda: w.row("p").status == "WAITING")
        victim = w.worker("parent")
    elif point == "during-wake":  # the wait returned in the resumed parent, before its next effect
        w.until(lambda: any(w.traces.glob("waking-*")))
        victim = w.worker("parent")
    else:  # a child inside its effect
        w.until(lambda: any(w.traces.glob("child-0-*")))
        victim = w.worker("child")
    victim.send_signal(sig)
    victim.wait(timeout=30)


POINTS = {
    "before-waiting": {"FAMILY_PAUSE": "0.8"},
    "after-waiting": {"CHILD_PAUSE": "0.8"},
    "during-wake": {"FAMILY_WAKE_PAUSE": "0.8"},
    "child-run": {"CHILD_PAUSE": "0.8"},
}


#: Every point and signal on SQLite; on PostgreSQL every SIGKILL and the SIGTERM during the wake.
_KILL_CASES = [
    pytest.param(store, point, sig, id=f"{store}-{point}-{'kill' if sig == signal.SIGKILL else 'term'}")
    for store in ("sqlite", "postgresql")
    for point in POINTS
    for sig in (signal.SIGKILL, signal.SIGTERM)
    if store == "sqlite" or sig == signal.SIGKILL or point == "during-wake"
]


@pytest.mark.parametrize(("db_url", "point", "sig"), _KILL_CASES, indirect=["db_url"])
def test_a_signal_at_each_point_of_a_fan_out_leaves_every_effect_and_every_child_once(
    family: object, point: str, sig: int, db_url: str
) -> None:
    w = family(**POINTS[point])  # type: ignore[operator]
    if point == "child-run":
        # One child at a time in the killed worker: a kill of three running children is three crashes of
        # the agent within the window, which opens its circuit breaker and holds the retries for the
        # cooldown (36 s at this scale), a wait that proves nothing here.
        w.child_concurrency = "1"
    w.create("p", "family")
    w.keep_up()
    _kill_point(w, point, sig)
    w.until(lambda: w.row("p").status in ("COMPLETED", "FAILED", "DEAD_LETTER"))
    row = w.row("p")
    assert (row.status, row.result) == ("COMPLETED", {"sum": 5, "statuses": ["COMPLETED"] * 3}), w.tail()
    assert w.effect_ids("before") == ["p/0/0"]
    assert w.effect_ids("after") == ["p/0/5"]
    assert w.effect_ids("child") == ["p.0.1/0/0", "p.0.2/0/0", "p.0.3/0/0"]
    children = w.read(lambda store: store.get_family("p"))
    assert [c[:2] for c in children.children] == [(f"p.0.{i}", "COMPLETED") for i in (1, 2, 3)]
    starts = [e for e in w.journal("p") if e["type"] == "TOOL_STARTED" and not e.get("carried")]
    assert sorted(str(e["invocation_id"]) for e in starts).count("p/0/1") >= 1
    waits = [e for e in w.journal("p") if e["type"] == "WAIT_COMPLETED" and not e.get("carried")]
    assert len(waits) == 1  # the outcome recorded once (copies carried past a marker aside); replayed after


BAD_LINES = {
    "empty-agent": "agent id '' is not allowed",
    "hostile-agent": "agent id '../../etc/passwd' is not allowed",
    "agent-not-str": "ctx.start_job: agent_id must be a string, got int",
    "payload-set": "ctx.start_job: the payload is not JSON",
    "payload-nan": "ctx.start_job: the payload is not JSON",
    "bad-job-id": "job id 'a/b' is not allowed",
    "own-id": "job p cannot be its own child",
    "taken-id": "ctx.start_job: job stranger already exists and was not started by this call (p/0/0)",
    "wait-empty": "ctx.wait_for_jobs: no handles to wait for",
    "wait-not-handle": "ctx.wait_for_jobs: expected JobHandle, got str",
    "wait-one-handle": "ctx.wait_for_jobs: pass a list of handles",
    "wait-stranger": "ctx.wait_for_jobs: job stranger is not a child of job p",
    "wait-unknown": "ctx.wait_for_jobs: job nobody does not exist",
    "timeout-nan": "ctx.wait_for_jobs: timeout must be a finite number",
    "timeout-negative": "ctx.wait_for_jobs: timeout must be a finite number",
}
#: The bad calls the store answers: run on both stores; the rest on SQLite only.
_STORE_BAD = ("taken-id", "wait-stranger", "wait-unknown")


_BAD_CASES = [
    pytest.param(store, bad, id=f"{store}-{bad}")
    for store in ("sqlite", "postgresql")
    for bad in BAD_LINES
    if store == "sqlite" or bad in _STORE_BAD
]


@pytest.mark.parametrize(("db_url", "bad"), _BAD_CASES, indirect=["db_url"])
def test_a_bad_child_job_call_fails_the_step_with_one_line_and_leaves_nothing(
    family: object, bad: str, db_url: str
) -> None:
    w = family(FAMILY_BAD=bad)  # type: ignore[operator]
    w.create("stranger", "family-child")
    w.create("p", "family")
    code, out = w.finish(w.run("p"))
    assert code == 1, out
    row = w.row("p")
    assert row.status != "COMPLETED" and row.error, row
    message = str(row.error[-1]["message"])
    assert BAD_LINES[bad] in message and "\n" not in message, message
    rows = w.read(lambda store: store.list_jobs(limit=100))
    assert sorted(r.id for r in rows) == ["p", "stranger"]  # no child created
    stranger = w.row("stranger")
    assert (stranger.status, stranger.payload) == ("PENDING", None)  # untouched
    kinds = {(e["type"], e.get("tool") or e.get("kind")) for e in w.journal("p")}
    assert not any(t in ("TOOL_STARTED", "WAIT_STARTED") for t, _ in kinds) or bad == "taken-id", kinds


def test_job_cancel_cancels_the_children_but_not_a_detached_one_and_show_names_them(
    family: object, db_url: str
) -> None:
    w = family(FAMILY_DETACHED="0")  # type: ignore[operator]
    w.create("p", "family")
    code, out = w.finish(w.run("p"))  # `run`: no worker runs the children, so the parent parks on them
    assert code == 0, out
    assert w.row("p").status == "WAITING"
    shown = w.job("show", "p").stdout
    assert "  waits for   jobs p.0.1, p.0.2, p.0.3 (no timeout) (p/0/4)" in shown, shown
    assert "  children    p.0.1 PENDING, p.0.2 PENDING, p.0.3 PENDING" in shown, shown
    assert "  parent      p (p/0/1, detached)" in w.job("show", "p.0.1").stdout
    assert "  parent      p (p/0/2)" in w.job("show", "p.0.2").stdout
    cancelled = w.job("cancel", "p")
    assert cancelled.returncode == 0, cancelled.stderr
    statuses = {job: w.row(job).status for job in ("p", "p.0.1", "p.0.2", "p.0.3")}
    assert statuses == {"p": "FAILED", "p.0.1": "PENDING", "p.0.2": "FAILED", "p.0.3": "FAILED"}
    again = w.job("cancel", "p")  # the parent has ended: refused, and the detached child still untouched
    assert again.returncode == 4 and w.row("p.0.1").status == "PENDING", again.stderr


def test_a_wait_for_jobs_with_timeout_zero_returns_their_state_at_once(family: object, db_url: str) -> None:
    w = family(FAMILY_TIMEOUT="0")  # type: ignore[operator]
    w.create("p", "family")
    code, out = w.finish(w.run("p"))
    assert code == 0, out
    row = w.row("p")
    assert (row.status, row.result) == ("COMPLETED", {"sum": 0, "statuses": ["PENDING"] * 3}), row
    assert w.effect_ids("after") == ["p/0/5"]  # the step went on past the wait, once
    assert {w.row(f"p.0.{i}").status for i in (1, 2, 3)} == {"PENDING"}  # the children live on
