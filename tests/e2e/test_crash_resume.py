"""SIGKILL at seeded random moments, rerun until done: nothing lost, nothing repeated beyond the contract.

Each attempt runs on a pod chosen at random: the first pod's disk, a second one, or a new empty one (a
fresh ``AGENTLIFE_DATA_DIR``, as a replaced pod has), so an attempt may resume where the session journal is
missing, or stale (the job ran elsewhere since). The store is shared: a SQLite file on another volume, or
the suite's PostgreSQL. What a resumed step replays comes from whichever holds it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest

from agentlife.stores import store_from_url
from procs import agent_env, spawn
from world import init_schema

#: ``AGENTLIFE_TESTS_EXHAUSTIVE=1`` (the nox ``chaos`` session) runs each kill loop on both stores with 13
#: kills a job; the suite runs the loop with ``verify`` on PostgreSQL and the one without on SQLite, 4 each
#: (each kill is a process start, about half a second of CPU), and the frozen attempt on one store.
ALL_STORES = os.environ.get("AGENTLIFE_TESTS_EXHAUSTIVE") == "1"
KILLS_PER_JOB = 13 if ALL_STORES else 4
STEPS = 100 if ALL_STORES else 60  # enough work that every kill lands before the job completes


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared-volume' / 'agentlife.db'}"
    return str(request.getfixturevalue("postgres_url"))


def _stores(*default: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize(
        "shared_url", ["sqlite", "postgresql"] if ALL_STORES else default, indirect=True
    )


def _run_until_done(tmp_path: Path, url: str, *, verify: bool, seed: int) -> tuple[int, Path]:
    rng = random.Random(seed)
    logs = tmp_path / "logs"
    logs.mkdir()
    (tmp_path / "shared-volume").mkdir()
    init_schema(url)
    _read(url, lambda store: store.create_job("kill-job", "kill-agent", None))
    kills = 0
    attempt = 0
    while True:
        attempt += 1
        pod = rng.choice(["a", "b", f"new-{attempt}"])
        env = agent_env(
            tmp_path / "pods" / pod,
            AGENTLIFE_DATABASE_URL=url,
            AGENTLIFE_JOB_ID="kill-job",
            AGENTLIFE_ATTEMPT=str(attempt),
            AGENTLIFE_HEALTH_PORT="off",
            KILL_LOG_DIR=str(logs),
            KILL_VERIFY="1" if verify else "0",
            KILL_STEPS=str(STEPS),
        )
        proc = spawn("agents.kill_agent:KillAgent", env)
        if kills < KILLS_PER_JOB:
            assert _kill_while_running(proc, rng), "the job completed before every kill landed: add steps"
            kills += 1
            continue
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (proc.returncode, (out + err).decode()[-3000:])
        return kills, logs


def _kill_while_running(proc: subprocess.Popen[bytes], rng: random.Random) -> bool:
    """SIGKILL at a random moment after the step loop started; False if the process had already exited."""
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    for raw in proc.stdout:
        if b"READY -> EXECUTING" in raw or b'"exit_code"' in raw or time.monotonic() > deadline:
            break
    time.sleep(rng.uniform(0.0, 0.4))
    alive = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    return alive and proc.returncode == -signal.SIGKILL


def _read(url: str, read):  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        store = store_from_url(url)
        await store.open()
        try:
            return await read(store)
        finally:
            await store.close()

    return anyio.run(go)


def _lines(path: Path) -> list[tuple[str, int]]:
    if not path.exists():
        return []
    return [(line.split()[0], int(line.split()[1])) for line in path.read_text().splitlines()]


def _final(url: str) -> object:
    row = _read(url, lambda store: store.get_job("kill-job"))
    assert row.status == "COMPLETED", row
    return row.result


def _reissued_per_attempt(records: list[tuple[str, int]]) -> Counter[int]:
    """For each attempt, how many of its calls had already been made by an earlier attempt."""
    first_attempt: dict[str, int] = {}
    repeats: Counter[int] = Counter()
    for key, attempt in records:
        if key in first_attempt and first_attempt[key] < attempt:
            repeats[attempt] += 1
        first_attempt.setdefault(key, attempt)
    return repeats


@pytest.mark.slow(14)
@_stores("postgresql")
def test_sigkill_with_verify_runs_each_side_effect_exactly_once_on_any_pod(
    tmp_path: Path, shared_url: str
) -> None:
    kills, logs = _run_until_done(tmp_path, shared_url, verify=True, seed=1234)
    assert kills == KILLS_PER_JOB
    effects = _lines(logs / "effects")
    ids = [key for key, _ in effects]
    assert sorted(ids) == sorted(f"kill-job/{s}/1" for s in range(STEPS))  # exactly once each
    assert _final(shared_url) == {"steps": list(range(STEPS))}  # no completed step lost or repeated
    assert max(_reissued_per_attempt(_lines(logs / "llm")).values(), default=0) <= 1


@pytest.mark.slow(12)
@_stores("sqlite")
def test_sigkill_without_verify_reruns_at_most_one_call_per_kill_on_any_pod(
    tmp_path: Path, shared_url: str
) -> None:
    kills, logs = _run_until_done(tmp_path, shared_url, verify=False, seed=5678)
    effects = _lines(logs / "effects")
    assert {key for key, _ in effects} == {f"kill-job/{s}/1" for s in range(STEPS)}
    assert len(effects) - STEPS <= kills
    assert max(_reissued_per_attempt(effects).values(), default=0) <= 1
    assert max(_reissued_per_attempt(_lines(logs / "llm")).values(), default=0) <= 1
    assert _final(shared_url) == {"steps": list(range(STEPS))}


def test_a_frozen_attempt_woken_after_its_successor_finished_never_repeats_the_effect(
    tmp_path: Path, shared_url: str
) -> None:
    # A node freeze (SIGSTOP) in the middle of a step: the successor claims the job on another pod and
    # finishes it; the frozen attempt wakes before its side-effecting call. The write-ahead record of that
    # call is fenced in the store, so the frozen attempt stops there (exit 1) and the effect happens once.
    logs = tmp_path / "logs"
    logs.mkdir()
    (tmp_path / "shared-volume").mkdir()
    init_schema(shared_url)
    _read(shared_url, lambda store: store.create_job("kill-job", "pause-agent", None))

    def start(attempt: int, pod: str) -> subprocess.Popen[bytes]:
        env = agent_env(
            tmp_path / "pods" / pod,
            AGENTLIFE_DATABASE_URL=shared_url,
            AGENTLIFE_JOB_ID="kill-job",
            AGENTLIFE_ATTEMPT=str(attempt),
            AGENTLIFE_HEALTH_PORT="off",
            AGENTLIFE_HEARTBEAT_JOB_INTERVAL_SECONDS="100",  # no heartbeat write in flight at the freeze
            KILL_LOG_DIR=str(logs),
        )
        return spawn("agents.kill_agent:PauseThenEffectAgent", env)

    frozen = start(1, "a")
    deadline = time.monotonic() + 60
    while not (logs / "paused-1").exists():
        assert frozen.poll() is None and time.monotonic() < deadline, frozen.communicate()
        time.sleep(0.01)
    frozen.send_signal(signal.SIGSTOP)
    try:
        successor = start(2, "b")
        out, err = successor.communicate(timeout=60)
        assert successor.returncode == 0, (out + err).decode()[-3000:]
        assert _lines(logs / "effects") == [("kill-job/0/1", 2)]
    finally:
        frozen.send_signal(signal.SIGCONT)
    out, err = frozen.communicate(timeout=60)
    assert frozen.returncode == 1, (out + err).decode()[-3000:]
    assert b"no longer holds the job" in out + err
    assert _lines(logs / "effects") == [("kill-job/0/1", 2)]  # the frozen attempt never ran it
    assert _final(shared_url) == {"done": True}
