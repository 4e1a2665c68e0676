"""``python -m agentlife worker``: real worker processes on SQLite and a real PostgreSQL, real probes, real
signals. Jobs run one after another on fresh agent instances; SIGTERM drains and hands the job back; the
reaper inside the worker reclaims a row whose heartbeat stopped; the runnable-jobs gauge counts."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentlife.stores import JobRecord, JobStatus, store_from_url
from procs import REPO, agent_env, cli_in_process, json_lines, run_cli, wait_for

TARGET = "agents.worker_agent:WorkerAgent"
AGENT = "worker-agent"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agentlife.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'agentlife.db'}"


# -- helpers -------------------------------------------------------------------------------------------


def create_jobs(url: str, *ids: str, agent: str = AGENT) -> None:
    async def go() -> None:
        store = store_from_url(url)
        await store.open()
        try:
            await store.init_schema()
            for job_id in ids:
                await store.create_job(job_id, agent, {"id": job_id})
        finally:
            await store.close()

    anyio.run(go)


def rows(url: str) -> dict[str, JobRecord]:
    async def go() -> dict[str, JobRecord]:
        store = store_from_url(url)
        await store.open()
        try:
            return {r.id: r for r in await store.list_jobs(limit=10_000)}
        finally:
            await store.close()

    return anyio.run(go)


def make_stale_running(url: str, job_id: str, heartbeat_age: float) -> None:
    """What a SIGKILLed process leaves: RUNNING with attempt 1 and a heartbeat long stopped."""
    at = time.time() - heartbeat_age
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            conn.execute(
                "UPDATE job SET status = 'RUNNING', attempt = 1, owner = 'gone:1:-:x',"
                " heartbeat_at = ?, updated_at = ? WHERE id = ?",
                (at, at, job_id),
            )
        finally:
            conn.close()
        return

    async def go() -> None:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            stamp = datetime.fromtimestamp(at, UTC)
            await conn.execute(
                "UPDATE job SET status = 'RUNNING', attempt = 1, owner = 'gone:1:-:x',"
                " heartbeat_at = $1, updated_at = $1 WHERE id = $2",
                stamp,
                job_id,
            )
        finally:
            await conn.close()

    anyio.run(go)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_env(tmp_path: Path, url: str, port: int | None = None, **extra: str) -> dict[str, str]:
    traces = tmp_path / "traces"
    traces.mkdir(exist_ok=True)
    env = agent_env(tmp_path / "data", WORKER_DIR=str(traces), AGENTLIFE_DATABASE_URL=url, **extra)
    if port is not None:
        env["AGENTLIFE_HEALTH_PORT"] = str(port)
    return env


def spawn_worker(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentlife", "worker", TARGET, *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(proc: subprocess.Popen[bytes], timeout: float = 60) -> tuple[int, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, (out + err).decode(errors="replace")


def http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def poll(fn: Any, timeout: float = 20.0) -> Any:
    """Call ``fn`` until it returns something truthy (connection errors count as not yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = fn()
        except OSError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{fn} stayed falsy for {timeout}s")
        time.sleep(0.02)


def _text_with(text: str, needle: str) -> str | None:
    return text if needle in text else None


def step_lines(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "traces" / "steps"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


# -- tests ---------------------------------------------------------------------------------------------


def test_a_worker_runs_queued_jobs_one_after_another_on_fresh_agents(tmp_path: Path, db_url: str) -> None:
    ids = [f"job-{i}" for i in range(5)]
    create_jobs(db_url, *ids)
    code, out = finish(spawn_worker(worker_env(tmp_path, db_url), "--max-jobs", "5"))
    assert code == 0, out
    assert "ran 5 jobs (--max-jobs)" in out
    final = rows(db_url)
    assert {job_id: final[job_id].status for job_id in ids} == dict.fromkeys(ids, JobStatus.COMPLETED)
    assert all(final[job_id].attempt == 1 for job_id in ids)
    lines = step_lines(tmp_path)
    # Oldest first, one process, every step of a job on its own instance that had seen no other job.
    assert [line[0] for line in lines if line[2] == "0"] == ids
    assert len({line[3] for line in lines}) == 1
    assert {line[5] for line in lines} == {"1"}
    instance_of = {line[0]: line[4] for line in lines}
    assert len(set(instance_of.values())) == 5
    for job_id in ids:
        assert final[job_id].result == {"instance": int(instance_of[job_id]), "jobs_seen": [job_id]}
        # Each job has its session journal where `run` would write it.
        assert list((tmp_path / "data" / "sessions" / job_id).glob("*"))


def test_max_jobs_leaves_the_rest_queued(tmp_path: Path, sqlite_url: str) -> None:
    create_jobs(sqlite_url, "a", "b", "c")
    code, out = finish(spawn_worker(worker_env(tmp_path, sqlite_url), "--max-jobs", "2"))
    assert code == 0, out
    assert [r.status for _, r in sorted(rows(sqlite_url).items())] == [
        JobStatus.COMPLETED,
        JobStatus.COMPLETED,
        JobStatus.PENDING,
    ]


def test_idle_timeout_exits_zero(tmp_path: Path, sqlite_url: str) -> None:
    create_jobs(sqlite_url)  # the tables only
    code, out = finish(spawn_worker(worker_env(tmp_path, sqlite_url), "--idle-timeout", "0.3"))
    assert code == 0, out
    exit_line = [line for line in json_lines(out) if line.get("exit_code") is not None][-1]
    assert "idle for" in str(exit_line["reason"])


def test_bad_arguments_are_one_line_usage_errors(tmp_path: Path, sqlite_url: str) -> None:
    env = worker_env(tmp_path, sqlite_url)
    for args, needle in (
        (["--max-jobs", "0"], "--max-jobs must be >= 1"),
        (["--idle-timeout", "-1"], "--idle-timeout must be > 0"),
        (["--time-scale", "0"], "--time-scale must be a finite number >= 0.001, got 0"),
        (["--time-scale", "inf"], "--time-scale must be a finite number >= 0.001, got inf"),
        (["--time-scale", "nan"], "--time-scale must be a finite number >= 0.001, got nan"),
        # Past MAX_ENV_SECONDS a thread timer would overflow and die with a traceback.
        (["--time-scale", "1e300"], "--time-scale 1e+300 makes retry.crash_backoff_seconds 1.8e+303 s"),
    ):
        result = run_cli("worker", TARGET, *args, env=env)
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert result.stderr.startswith("agentlife: error: ") and needle in result.stderr
    result = run_cli("worker", "agents.worker_agent:Nope", env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_a_poison_job_is_dead_lettered_and_the_worker_goes_on(tmp_path: Path, sqlite_url: str) -> None:
    create_jobs(sqlite_url, "poison", "fine")
    env = worker_env(tmp_path, sqlite_url, WORKER_CRASH_JOB="poison")
    # Scaled x 0.01: the crash backoff schedule 5 s, 60 s, ... is 0.05 s, 0.6 s, ...
    code, out = finish(spawn_worker(env, "--idle-timeout", "2", "--time-scale", "0.01"))
    assert code == 0, out
    final = rows(sqlite_url)
    assert final["fine"].status == JobStatus.COMPLETED
    assert final["poison"].status == JobStatus.DEAD_LETTER
    crashes = [e for e in final["poison"].error if e.get("exit_code") == 1]
    assert len(crashes) == 3 and {e["attempt"] for e in crashes} == {1, 2, 3}
    # Each retry waited its step of the backoff schedule; the third identical crash dead-lettered it.
    decisions = [
        line["msg"] for line in json_lines(out) if str(line.get("msg")).startswith("job poison crashed")
    ]
    assert [d.split(" (")[0] for d in decisions] == [
        "job poison crashed: RETRYING in 0.05s",
        "job poison crashed: RETRYING in 0.6s",
        "job poison crashed: DEAD_LETTER",
    ]


def test_readiness_status_and_sigterm_mid_job_hands_the_job_to_the_next_worker(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    create_jobs(db_url)
    create_jobs(db_url, "other-1", "other-2", agent="other-agent")
    port = free_port()
    env = worker_env(tmp_path, db_url, port, WORKER_GATE="1")
    first = spawn_worker(env, "--time-scale", "0.02")
    procs.append(first)
    # Idle: ready, and the gauge counts the runnable jobs of every agent (its own at 0).
    assert poll(lambda: http(port, "/readyz") == (200, "ok\n"))
    status = poll(lambda: http(port, "/status"))
    assert '"state":"idle"' in status[1]
    metrics = poll(
        lambda: _text_with(http(port, "/metrics")[1], 'agentlife_runnable_jobs{agent_id="other-agent"} 2')
    )
    assert f'agentlife_runnable_jobs{{agent_id="{AGENT}"}} 0' in metrics
    # Busy: not ready, /status names the job.
    create_jobs(db_url, "gated")
    wait_for(tmp_path / "traces" / "waiting-gated-1")
    assert http(port, "/readyz") == (503, "busy\n")
    assert '"current_job":"gated"' in http(port, "/status")[1]
    assert http(port, "/healthz")[0] == 200
    # SIGTERM mid-job: draining (still not ready), then 143 with the row handed back, resumable.
    first.send_signal(signal.SIGTERM)
    assert http(port, "/readyz")[0] == 503
    code, out = finish(first)
    assert code == 143, out
    row = rows(db_url)["gated"]
    assert (row.status, row.attempt) == (JobStatus.PENDING, 1)
    assert any("handed back" in str(line.get("msg")) for line in json_lines(out))
    # The next worker claims it as attempt 2 and completes it.
    (tmp_path / "traces" / "gate-gated").touch()
    code, out = finish(spawn_worker(worker_env(tmp_path, db_url), "--max-jobs", "1"))
    assert code == 0, out
    row = rows(db_url)["gated"]
    assert (row.status, row.attempt) == (JobStatus.COMPLETED, 2)


def test_sigterm_while_idle_exits_143_promptly(
    tmp_path: Path, sqlite_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    create_jobs(sqlite_url)
    port = free_port()
    proc = spawn_worker(worker_env(tmp_path, sqlite_url, port))
    procs.append(proc)
    assert poll(lambda: http(port, "/readyz")[0] == 200)
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc, timeout=10)
    assert code == 143, out


def test_the_reaper_in_a_worker_reclaims_a_row_whose_heartbeat_stopped(tmp_path: Path, db_url: str) -> None:
    create_jobs(db_url, "zombie")
    make_stale_running(db_url, "zombie", heartbeat_age=3600)
    # Scaled: the 300 s threshold is 3 s, the reaper runs every 0.6 s, the first backoff is 0.05 s.
    code, out = finish(spawn_worker(worker_env(tmp_path, db_url), "--time-scale", "0.01", "--max-jobs", "1"))
    assert code == 0, out
    reaped = [line for line in json_lines(out) if line.get("event") == "reaped"]
    assert [(r["reaped_job_id"], r["decision"], r["new_attempt"]) for r in reaped] == [
        ("zombie", "RETRYING", 2)
    ]
    row = rows(db_url)["zombie"]
    assert (row.status, row.attempt) == (JobStatus.COMPLETED, 2)  # reaped 1, claimed once: 2, not 3
    assert [e["error_class"] for e in row.error] == ["HeartbeatStale"]


def test_a_worker_restarted_in_place_takes_back_its_killed_predecessors_job_before_the_threshold(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    create_jobs(db_url, "held")
    first = spawn_worker(worker_env(tmp_path, db_url, WORKER_GATE="1"))
    procs.append(first)
    wait_for(tmp_path / "traces" / "waiting-held-1")
    first.kill()  # an OOM kill: no drain, the row stays RUNNING with a fresh heartbeat
    first.communicate()
    assert rows(db_url)["held"].status == JobStatus.RUNNING
    (tmp_path / "traces" / "gate-held").touch()
    # Scaled x 0.1: the heartbeat threshold is 30 s, so only the dead-owner check can hand the row back
    # within the test; it does once the heartbeat is one job heartbeat interval (3 s) old.
    code, out = finish(
        spawn_worker(worker_env(tmp_path, db_url), "--max-jobs", "1", "--time-scale", "0.1"), timeout=60
    )
    assert code == 0, out
    row = rows(db_url)["held"]
    assert (row.status, row.attempt) == (JobStatus.COMPLETED, 2)
    assert [e["error_class"] for e in row.error] == ["OwnerGone"]
    assert 3.0 <= row.error[0]["at"] - row.error[0]["heartbeat_at"] < 30.0
    reaped = [line for line in json_lines(out) if line.get("event") == "reaped"]
    assert [(r["reaped_job_id"], r["new_attempt"]) for r in reaped] == [("held", 2)]


def _set_owner(url: str, job_id: str, owner: str, heartbeat_age: float) -> None:
    """A RUNNING row (attempt 1) claimed by ``owner``, its heartbeat ``heartbeat_age`` seconds old."""
    at = time.time() - heartbeat_age
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            conn.execute(
                "UPDATE job SET status = 'RUNNING', attempt = 1, owner = ?, heartbeat_at = ? WHERE id = ?",
                (owner, at, job_id),
            )
        finally:
            conn.close()
        return

    async def go() -> None:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                "UPDATE job SET status = 'RUNNING', attempt = 1, owner = $1, heartbeat_at = $2 WHERE id = $3",
                owner,
                datetime.fromtimestamp(at, UTC),
                job_id,
            )
        finally:
            await conn.close()

    anyio.run(go)


def _exited_owner(namespace: str | None = None) -> str:
    """The claim token of a process of this host that has exited, in ``namespace`` (default: this one's)."""
    from agentlife.stores._base import _start_ticks, namespace_id

    gone = subprocess.Popen(["sleep", "30"])
    ticks = _start_ticks(gone.pid)
    gone.kill()
    gone.wait()
    return f"{socket.gethostname()}:{gone.pid}:{ticks}:0a0b0c0d:{namespace or namespace_id()}"


class _LiveOwner:
    """Keeps a row's heartbeat fresh from a thread, as its process in another container would."""

    def __init__(self, url: str, job_id: str) -> None:
        import threading

        self.url, self.job_id = url, job_id
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def __enter__(self) -> _LiveOwner:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def _beat(self) -> None:
        while not self.stop.wait(0.05):
            if self.url.startswith("sqlite"):
                import sqlite3

                conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=10, isolation_level=None)
                try:
                    conn.execute("UPDATE job SET heartbeat_at = ? WHERE id = ?", (time.time(), self.job_id))
                finally:
                    conn.close()
            else:
                anyio.run(self._beat_pg)

    async def _beat_pg(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.url)
        try:
            await conn.execute("UPDATE job SET heartbeat_at = now() WHERE id = $1", self.job_id)
        finally:
            await conn.close()


def test_a_live_job_in_another_pid_namespace_is_never_reaped(tmp_path: Path, db_url: str) -> None:
    # Two containers share this host name (hostNetwork, compose's hostname:) but not their pid namespace:
    # the other one's pid is not visible here, yet its process runs and beats every 0.05 s. The reaper
    # must leave it alone; a row whose owner died in this very namespace is reaped beside it.
    import uuid

    create_jobs(db_url, "foreign", "dead-here")
    _set_owner(db_url, "foreign", _exited_owner(f"{uuid.uuid4()}.4026531836"), heartbeat_age=0.0)
    _set_owner(db_url, "dead-here", _exited_owner(), heartbeat_age=1.0)
    env = worker_env(tmp_path, db_url, WORKER_STEP_SECONDS="1")
    # Scaled x 0.01: threshold 3 s, heartbeat interval (the freshness window) 0.3 s, a reaper pass every
    # 0.3 s; the job it runs meanwhile takes 2 s, so about seven passes see the foreign row.
    with _LiveOwner(db_url, "foreign"):
        code, out = finish(spawn_worker(env, "--time-scale", "0.01", "--max-jobs", "1"))
    assert code == 0, out
    reaped = [line for line in json_lines(out) if line.get("event") == "reaped"]
    assert [(r["job_id"], r["reaped_job_id"], r["new_attempt"]) for r in reaped] == [
        ("dead-here", "dead-here", 2)
    ]
    final = rows(db_url)
    assert (final["foreign"].status, final["foreign"].attempt, final["foreign"].error) == ("RUNNING", 1, [])
    assert (final["dead-here"].status, final["dead-here"].attempt) == (JobStatus.COMPLETED, 2)


def test_the_reapers_log_line_names_the_reaped_job_not_the_one_running(
    tmp_path: Path, sqlite_url: str
) -> None:
    create_jobs(sqlite_url, "busy")
    env = worker_env(tmp_path, sqlite_url, WORKER_GATE="1")
    worker = spawn_worker(env, "--time-scale", "0.01", "--max-jobs", "2")
    try:
        wait_for(tmp_path / "traces" / "waiting-busy-1")
        create_jobs(sqlite_url, "zombie")
        make_stale_running(sqlite_url, "zombie", heartbeat_age=3600)  # reaped while "busy" runs
        poll(lambda: rows(sqlite_url)["zombie"].status == JobStatus.RETRYING)
        (tmp_path / "traces" / "gate-busy").touch()
        (tmp_path / "traces" / "gate-zombie").touch()
        code, out = finish(worker)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert code == 0, out
    [reaped] = [line for line in json_lines(out) if line.get("event") == "reaped"]
    assert (reaped["job_id"], reaped["attempt"], reaped["reaped_job_id"], reaped["new_attempt"]) == (
        "zombie",
        1,
        "zombie",
        2,
    )
    assert rows(sqlite_url)["zombie"].attempt == 2


def test_a_job_parked_for_approval_is_resumed_by_a_worker_once_approved(
    tmp_path: Path, sqlite_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    create_jobs(sqlite_url, "deploy")
    port = free_port()
    # Scaled: the 1800 s approval idle timeout is 1.8 s; the worker stays up for 1.8 s without a job.
    env = worker_env(tmp_path, sqlite_url, port, WORKER_RESTRICTED="1")
    worker = spawn_worker(env, "--time-scale", "0.001", "--idle-timeout", "30000")
    procs.append(worker)
    poll(lambda: rows(sqlite_url)["deploy"].status == JobStatus.WAITING_FOR_APPROVAL)
    assert poll(lambda: http(port, "/readyz") == (503, "busy\n"))  # still waiting on the approval
    # After the idle timeout the worker parks the job and goes on without it (ready for other jobs): nothing
    # attends the job any more, so the approval makes it runnable again rather than "taken by its process".
    assert poll(lambda: http(port, "/readyz") == (200, "ok\n"))
    assert rows(sqlite_url)["deploy"].status == JobStatus.WAITING_FOR_APPROVAL
    approved = cli_in_process("job", "approve", "deploy", env=worker_env(tmp_path, sqlite_url))
    assert approved.returncode == 0, approved.stderr
    assert "PENDING" in approved.stdout
    poll(lambda: rows(sqlite_url)["deploy"].status == JobStatus.COMPLETED)
    assert (tmp_path / "traces" / "deploys").read_text().count("deploy ") == 1
    worker.send_signal(signal.SIGTERM)
    code, out = finish(worker)
    assert code == 143, out


def test_each_job_ends_with_a_job_line_and_only_the_worker_logs_an_exit(
    tmp_path: Path, sqlite_url: str
) -> None:
    create_jobs(sqlite_url, "j-1", "j-2")
    code, out = finish(spawn_worker(worker_env(tmp_path, sqlite_url), "--max-jobs", "2"))
    assert code == 0, out
    lines = json_lines(out)
    # One exit line, the process's own: a job's end is no "exit 0".
    exits = [line for line in lines if str(line.get("msg", "")).startswith("exit ")]
    assert [(line["logger"], line["exit_code"]) for line in exits] == [("agentlife.worker", 0)]
    ended = [line for line in lines if line.get("event") == "job_ended"]
    assert [(line["job_id"], line["attempt"], line["outcome"]) for line in ended] == [
        ("j-1", 1, "done"),
        ("j-2", 1, "done"),
    ]
    assert ended[0]["msg"] == "job j-1 attempt 1 done: job COMPLETED"


def test_readyz_is_503_while_claims_fail_and_200_once_the_store_is_back(
    tmp_path: Path, postgres_server: Any, postgres_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    create_jobs(postgres_url)
    port = free_port()
    worker = spawn_worker(worker_env(tmp_path, postgres_url, port), "--time-scale", "0.02")
    procs.append(worker)
    assert poll(lambda: http(port, "/readyz") == (200, "ok\n"))
    with postgres_server.stopped():
        # Idle, but every claim fails: it cannot take a job, so it is not ready (and says why).
        assert poll(lambda: http(port, "/readyz") == (503, "store unavailable\n"))
        assert '"claim_error":' in http(port, "/status")[1]
    assert poll(lambda: http(port, "/readyz") == (200, "ok\n"), timeout=30)
    create_jobs(postgres_url, "after")
    poll(lambda: rows(postgres_url)["after"].status == JobStatus.COMPLETED)
    worker.send_signal(signal.SIGTERM)
    code, out = finish(worker)
    assert code == 143, out
    # Nothing but JSON lines (asyncpg's own pool warnings carry their traceback inside one).
    assert [line for line in out.splitlines() if not line.startswith("{")] == []


def test_a_worker_on_a_database_without_the_schema_exits_1_naming_db_init(
    tmp_path: Path, postgres_url: str
) -> None:
    # postgres_url is a fresh, empty schema: nobody ran `db init`.
    code, out = finish(spawn_worker(worker_env(tmp_path, postgres_url)), timeout=30)
    assert code == 1, out
    fatal = [line for line in json_lines(out) if line.get("level") == "ERROR"]
    assert len(fatal) == 1 and "run `python -m agentlife db init`" in str(fatal[0]["msg"])
    assert "claim failed" not in out
