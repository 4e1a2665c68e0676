"""Events end to end, with real processes only: ``python -m agentlife job send`` into jobs that wait with
``ctx.wait_for_event``, run by ``run`` and ``worker`` on SQLite and PostgreSQL, SIGTERM and SIGKILL while
they wait. Every event is kept until a wait takes it, taken in order, by exactly one wait, once."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_wait_processes import World

from agentlife.stores import CheckpointStore
from procs import REPO, wait_for, wait_for_handler

LISTENER = "agents.wait_agent:Listener"


def _world(tmp_path: Path, url: str, **env: str) -> World:
    world = World(tmp_path, url, **env)
    world.create("job-1", "listener")
    return world


def _send(world: World, *args: str, job_id: str = "job-1") -> subprocess.CompletedProcess[str]:
    return world.job("send", job_id, *args)


def _taken(world: World) -> list[tuple[str, object]]:
    """(name, taken_by) of every event of the store, in the order they were sent."""
    query = "SELECT name, taken_by FROM job_event ORDER BY seq"
    if world.url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(world.url.removeprefix("sqlite:///"))
        try:
            return [tuple(r) for r in conn.execute(query).fetchall()]  # type: ignore[misc]
        finally:
            conn.close()
    import anyio
    import asyncpg

    async def read() -> list[tuple[str, object]]:
        conn = await asyncpg.connect(world.url)
        try:
            return [tuple(r) for r in await conn.fetch(query)]  # type: ignore[misc]
        finally:
            await conn.close()

    return anyio.run(read)


def test_events_sent_before_the_waits_are_kept_and_taken_in_order(tmp_path: Path, db_url: str) -> None:
    world = _world(tmp_path, db_url)
    for payload in ('{"n": 1}', '{"n": 2}', '{"n": 3}'):
        assert _send(world, "answer", "--payload", payload).returncode == 0
    other = _send(world, "unasked", "--payload", '"kept"')  # nothing waits for it: kept, not lost
    assert other.returncode == 0 and "sent to job job-1" in other.stdout, other.stderr
    code, out = world.finish(world.run("job-1", LISTENER))
    assert code == 0, out
    row = world.row("job-1")
    assert (row.status, row.result) == ("COMPLETED", {"got": [{"n": 1}, {"n": 2}]}), row
    assert _taken(world) == [
        ("answer", "job-1/0/1"),
        ("answer", "job-1/0/2"),
        ("answer", None),
        ("unasked", None),
    ]


def test_a_long_event_wait_parks_and_a_send_wakes_the_worker_at_once(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    world = _world(tmp_path, db_url, AGENTLIFE_PARK_AFTER_SECONDS="0.5")
    code, out = world.finish(world.run("job-1", LISTENER))
    assert code == 0, out  # no timeout: parked, the process free
    assert world.row("job-1").status == "WAITING"
    shown = world.job("show", "job-1")
    assert "  waits for   event 'answer' (no timeout) (job-1/0/1)" in shown.stdout, shown.stdout
    listed = world.job("list", "--status", "WAITING")
    assert "job-1" in listed.stdout, listed.stderr
    worker = subprocess.Popen(
        [sys.executable, "-m", "agentlife", "worker", LISTENER, "--max-jobs", "2", "--idle-timeout", "60"],
        env=world.env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    procs.append(worker)
    assert _send(world, "answer", "--payload", '{"n": 1}').returncode == 0
    _wait_status(world, "WAITING", attempt=2)  # woke, took the first, parked at the second
    assert _send(world, "answer", "--payload", '{"n": 2}').returncode == 0
    code, out = world.finish(worker, timeout=90)
    assert code == 0, out
    row = world.row("job-1")
    assert (row.status, row.result, row.error) == ("COMPLETED", {"got": [{"n": 1}, {"n": 2}]}, []), row
    assert world.effects() == (["job-1/0/0"], ["job-1/0/3"])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signal_during_a_short_event_wait_loses_no_event_and_takes_none_twice(
    tmp_path: Path, db_url: str, sig: signal.Signals
) -> None:
    world = _world(tmp_path, db_url, EVENT_TIMEOUT="20", AGENTLIFE_APPROVAL_POLL_SECONDS="0.05")
    assert _send(world, "answer", "--payload", '{"n": 1}').returncode == 0
    proc = world.run("job-1", LISTENER)
    wait_for(world.traces / "sleeping-1", timeout=60)
    wait_for_handler(proc)
    proc.send_signal(sig)
    code, out = world.finish(proc)
    assert code == (143 if sig == signal.SIGTERM else -9), out
    assert _send(world, "answer", "--payload", '{"n": 2}').returncode == 0
    code, out = world.finish(world.run("job-1", LISTENER, AGENTLIFE_ATTEMPT="2"))
    assert code == 0, out
    row = world.row("job-1")
    assert (row.status, row.result) == ("COMPLETED", {"got": [{"n": 1}, {"n": 2}]}), row
    assert world.effects() == (["job-1/0/0"], ["job-1/0/3"])
    assert _taken(world) == [("answer", "job-1/0/1"), ("answer", "job-1/0/2")]


def test_an_event_wait_with_a_timeout_returns_none_and_keeps_later_events(
    tmp_path: Path, db_url: str
) -> None:
    world = _world(tmp_path, db_url, EVENT_TIMEOUT="0.2")
    code, out = world.finish(world.run("job-1", LISTENER))
    assert code == 0, out
    assert world.row("job-1").result == {"got": [None, None]}
    assert world.events("job-1", "WAIT_COMPLETED")[0]["outcome"] == {"timed_out": True}
    sent = _send(world, "answer", "--payload", "1")
    assert (sent.returncode, sent.stdout) == (4, ""), sent.stderr  # the job is COMPLETED: refused
    assert "cannot send 'answer' to job job-1: it is COMPLETED" in sent.stderr
    assert _taken(world) == []


def test_an_answer_sent_after_the_deadline_is_not_taken_by_the_wait_resumed_late_on_another_pod(
    tmp_path: Path, db_url: str
) -> None:
    # The first wait (1 s) parks; the answer comes after its deadline, and the job resumes after that on a
    # pod that never ran it. What came first decides: the deadline, so the first wait times out, and the
    # second wait, started after the answer was sent, takes it.
    world = _world(tmp_path, db_url, EVENT_TIMEOUT="1", AGENTLIFE_PARK_AFTER_SECONDS="0.3")
    code, out = world.finish(world.run("job-1", LISTENER))
    assert code == 0 and world.row("job-1").status == "WAITING", out
    until = world.wait("job-1").until
    assert until is not None
    time.sleep(max(0.0, until + 0.05 - time.time()))
    assert _send(world, "answer", "--payload", '{"n": 1}').returncode == 0
    code, out = world.finish(world.run("job-1", LISTENER, AGENTLIFE_ATTEMPT="2", pod="b"))
    assert code == 0, out
    row = world.row("job-1")
    assert (row.status, row.result) == ("COMPLETED", {"got": [None, {"n": 1}]}), row
    assert _taken(world) == [("answer", "job-1/0/2")]
    assert world.effects() == (["job-1/0/0"], ["job-1/0/3"])


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (("answer",), 3, "job nope does not exist"),
        (("answer", "--payload", "{not json"), 2, "--payload is not valid JSON"),
        (("answer", "--payload", "NaN"), 2, "NaN is not a JSON number"),
        (("", "--payload", "1"), 2, "an event name is a non-empty string"),
        (("x" * 201,), 2, "an event name is a non-empty string of at most 200 characters"),
        # Almost right: what the journal could not give back exactly, and names that would mislead a reader.
        (("answer", "--payload", '"\\ud800"'), 2, "a lone surrogate"),
        (("answer", "--payload", "[" * 200 + "]" * 200), 2, "nested deeper than 128 levels"),
        (("answer", "--payload", "1" * 5000), 2, "--payload is not valid JSON"),
        (("answer", "--payload", "1e400"), 2, "JSON has no NaN or infinity"),
        (("e\x01v",), 2, "holds control characters"),
        (("\u202eanswer",), 2, "holds control characters"),
        (("   ",), 2, "an event name is a non-empty string"),  # only spaces: nothing a reader can see
        (("an\u00a0swer",), 2, "holds control characters"),  # a space that looks like none, or like " "
    ],
)
def test_job_send_refuses_bad_input_with_one_clear_line(
    tmp_path: Path, args: tuple[str, ...], code: int, needle: str
) -> None:
    world = _world(tmp_path, f"sqlite:///{tmp_path / 'agentlife.db'}")
    job_id = "nope" if code == 3 else "job-1"
    sent = _send(world, *args, job_id=job_id)
    assert (sent.returncode, sent.stdout) == (code, ""), sent.stderr
    assert needle in sent.stderr and len(sent.stderr.strip().splitlines()) == 1, sent.stderr
    assert _taken(world) == []


def test_job_send_without_a_payload_sends_null_and_says_a_wait_takes_it_for_a_timeout(tmp_path: Path) -> None:
    # ctx.wait_for_event returns the payload, and None at a timeout: a bare send is told so, at once.
    world = _world(tmp_path, f"sqlite:///{tmp_path / 'agentlife.db'}")
    longest = "n" * 200
    bare = _send(world, longest)
    assert bare.returncode == 0 and "sent to job job-1" in bare.stdout, bare.stderr
    assert bare.stderr.count("\n") == 1
    assert "the event carries null" in bare.stderr and "also what it returns at a timeout" in bare.stderr
    explicit = _send(world, "go", "--payload", "null")  # asked for: no note
    assert (explicit.returncode, explicit.stderr) == (0, "")
    conn = sqlite3.connect(tmp_path / "agentlife.db")
    try:
        payloads = conn.execute("SELECT name, payload FROM job_event ORDER BY seq").fetchall()
    finally:
        conn.close()
    assert payloads == [(longest, "null"), ("go", "null")]


def test_job_send_refuses_a_payload_over_256_kib_and_keeps_nothing(tmp_path: Path) -> None:
    world = _world(tmp_path, f"sqlite:///{tmp_path / 'agentlife.db'}")
    big = tmp_path / "big.json"
    big.write_text('"' + "x" * (300 * 1024) + '"')
    sent = _send(world, "answer", "--payload-file", str(big))
    assert (sent.returncode, sent.stdout) == (2, ""), sent.stderr
    assert "more than 262144" in sent.stderr and len(sent.stderr.strip().splitlines()) == 1
    assert _taken(world) == []


def test_a_wait_for_event_with_a_bad_timeout_fails_the_step_with_one_clear_error(tmp_path: Path) -> None:
    world = _world(tmp_path, f"sqlite:///{tmp_path / 'agentlife.db'}", EVENT_TIMEOUT="-1")
    code, out = world.finish(world.run("job-1", LISTENER))
    assert code == 1, out
    assert "ctx.wait_for_event: timeout must be a finite number from 0 to 1e+09, got -1.0" in out, out


def _wait_status(world: World, status: str, attempt: int, timeout: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout
    while True:
        row = world.row("job-1")
        if row.status == status and row.attempt >= attempt:
            return
        assert time.monotonic() < deadline, row
        time.sleep(0.05)


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.exhaustive)])
def test_random_kills_and_drains_around_event_waits_take_every_event_once(
    tmp_path: Path, db_url: str, seed: int
) -> None:
    # Seeded: SIGKILL or SIGTERM at a random moment of each attempt while the job waits for two events
    # (parked: no timeout), the second sent in the middle of the kills, until an attempt runs to its end.
    import random
    import time

    rng = random.Random(seed)
    world = _world(tmp_path, db_url, AGENTLIFE_PARK_AFTER_SECONDS="0.3")
    assert _send(world, "answer", "--payload", '{"n": 1}').returncode == 0
    attempt, outcomes = 0, []
    while world.row("job-1").status != "COMPLETED":
        attempt += 1
        assert attempt < 40, outcomes
        if attempt == 4:
            assert _send(world, "answer", "--payload", '{"n": 2}').returncode == 0
        proc = world.run("job-1", LISTENER, AGENTLIFE_ATTEMPT=str(attempt))
        if attempt <= 6:
            time.sleep(rng.uniform(0.0, 1.0))
            proc.send_signal(rng.choice([signal.SIGKILL, signal.SIGTERM]))
        code, out = world.finish(proc)
        assert code in (0, 143, -9, -15), out  # -15: a SIGTERM before the handler was installed
        outcomes.append(code)
    row = world.row("job-1")
    assert row.result == {"got": [{"n": 1}, {"n": 2}]}, outcomes
    world.assert_effects_under_kills("job-1/0/0", "job-1/0/3", outcomes)
    assert _taken(world) == [("answer", "job-1/0/1"), ("answer", "job-1/0/2")]


def test_job_show_lists_the_events_no_wait_has_taken_and_a_full_job_refuses_more(
    tmp_path: Path, db_url: str
) -> None:
    from agentlife.stores._events import MAX_KEPT_EVENTS

    world = _world(tmp_path, db_url)
    for name in ("answer", "unasked", "answer"):
        assert _send(world, name).returncode == 0
    shown = world.job("show", "job-1")
    assert "  events      'answer' (2), 'unasked' (1) not taken" in shown.stdout, shown.stdout

    async def fill(store: CheckpointStore) -> int:
        for _ in range(MAX_KEPT_EVENTS - 3):
            await store.send_event("job-1", "flood")
        return MAX_KEPT_EVENTS

    world.read(fill)
    refused = _send(world, "answer", "--payload", '"one too many"')
    assert (refused.returncode, refused.stdout) == (4, ""), refused.stderr
    assert f"already keeps {MAX_KEPT_EVENTS} events no wait has taken" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert len(_taken(world)) == MAX_KEPT_EVENTS  # nothing of the refused send was kept
