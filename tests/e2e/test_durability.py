"""Durability end to end: real ``python -m agentlife`` processes, a real PostgreSQL.

The store, policy and delivery units are tested on their own elsewhere; here the same promises are checked
through whole processes: schema creation and the missing job row, PostgreSQL down at boot and mid-run,
attempt fencing between two live processes, delivery across SIGKILLs, and the crash policy and phase budget
computed from what real attempts left behind. The agent is ``tests/agents/durable_agent.py``; it leaves a
marker or an fsynced line for everything it does, so the test can tell what really happened.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import signal
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import orjson
import pytest

from _pg import PostgresServer
from agentlife import derive_total_timeout, should_retry_after_crash
from agentlife.stores import PostgresStore
from agentlife.stores._policy import p95_from_journals
from procs import agent_env, json_lines, run_cli, spawn, wait_for

AGENT = "agents.durable_agent:DurableAgent"


# -- helpers ----------------------------------------------------------------------------------------------


def _password(url: str) -> str:
    password = urllib.parse.urlsplit(url).password
    assert password
    return password


def _schema(url: str) -> str:
    return urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["search_path"][0]


def _fetch(url: str, sql: str, *args: Any) -> list[dict[str, Any]]:
    """Run one query on a private connection (the URL's search_path selects the test's schema)."""

    async def go() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(url)
        try:
            return [dict(row) for row in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    return asyncio.run(go())


def _row(url: str, job_id: str) -> dict[str, Any] | None:
    rows = _fetch(url, "SELECT * FROM job WHERE id = $1", job_id)
    if not rows:
        return None
    row = rows[0]
    for key in ("payload", "tokens_consumed", "token_budget", "error", "result"):
        if row[key] is not None:
            row[key] = orjson.loads(row[key])
    return row


def _must_row(url: str, job_id: str) -> dict[str, Any]:
    row = _row(url, job_id)
    assert row is not None, f"no job row {job_id}"
    return row


def _checkpoint_doc(row: dict[str, Any]) -> dict[str, Any]:
    doc = orjson.loads(row["checkpoint"])
    assert isinstance(doc, dict)
    return doc


def _history(url: str, job_id: str) -> list[tuple[str, int]]:
    rows = _fetch(
        url,
        "SELECT checkpoint_id, step FROM checkpoint_history WHERE job_id = $1 ORDER BY created_at",
        job_id,
    )
    return [(row["checkpoint_id"], row["step"]) for row in rows]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _errors(output: str) -> list[str]:
    return [str(line["msg"]) for line in json_lines(output) if line.get("level") in ("ERROR", "CRITICAL")]


def _msgs(output: str, needle: str) -> list[dict[str, Any]]:
    return [line for line in json_lines(output) if needle in str(line.get("msg", ""))]


class Live:
    """A running ``python -m agentlife run`` whose output is collected while it runs."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = spawn(AGENT, env, *args)
        self._chunks: list[str] = []
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._pump, args=(stream,), daemon=True)
            for stream in (self.proc.stdout, self.proc.stderr)
        ]
        for reader in self._readers:
            reader.start()

    def _pump(self, stream: Any) -> None:
        with stream:
            for raw in stream:
                with self._changed:
                    self._chunks.append(raw.decode(errors="replace"))
                    self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        with self._changed:
            return "".join(self._chunks)

    def wait_log(self, needle: str, timeout: float = 20.0) -> dict[str, Any]:
        """The first JSON log line whose message contains ``needle``, waiting for it if need be."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = _msgs("".join(self._chunks), needle)
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0 or (
                    self.proc.poll() is not None and not any(r.is_alive() for r in self._readers)
                ):
                    raise AssertionError(f"no log line with {needle!r}:\n{''.join(self._chunks)[-4000:]}")
                self._changed.wait(min(left, 0.1))

    def status(self) -> dict[str, Any]:
        """``GET /status`` from the process's probe server."""
        port = self.wait_log("probe server listening")["port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as response:
            body = orjson.loads(response.read())
        assert isinstance(body, dict)
        return body

    def wait_status(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            body = self.status()
            if predicate(body):
                return body
            if time.monotonic() > deadline:
                raise AssertionError(f"/status never matched: {body}")
            time.sleep(0.02)

    def wait(self, timeout: float = 30.0) -> int:
        """Wait for the exit (and the last output) and return the exit code."""
        code = self.proc.wait(timeout)
        for reader in self._readers:
            reader.join(5)
        return code

    def kill(self) -> None:
        """SIGKILL, as the kernel's OOM killer would."""
        self.proc.send_signal(signal.SIGKILL)
        assert self.wait() == -signal.SIGKILL


@pytest.fixture
def live() -> Iterator[Callable[..., Live]]:
    """Starts `Live` processes and kills whatever a failing test left running."""
    started: list[Live] = []

    def start(env: dict[str, str], *args: str) -> Live:
        process = Live(env, *args)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.proc.poll() is None:
            process.proc.kill()
            process.proc.wait(10)


@pytest.fixture
def pg_url(postgres_url: str) -> str:
    """``postgres_url`` with the agentlife schema already created (``db init`` itself is tested below)."""

    async def init() -> None:
        store = PostgresStore(postgres_url)
        await store.open()
        try:
            await store.init_schema()
        finally:
            await store.close()

    asyncio.run(init())
    return postgres_url


def _env(
    tmp_path: Path, url: str, job_id: str, attempt: int = 1, *, data: str = "data", **extra: str
) -> dict[str, str]:
    """A child's environment; ``work`` (the agent's markers and effect logs) is shared by all attempts."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return agent_env(
        tmp_path / data,
        AGENTLIFE_JOB_ID=job_id,
        AGENTLIFE_ATTEMPT=str(attempt),
        AGENTLIFE_DATABASE_URL=url,
        DURABLE_DIR=str(work),
        **extra,
    )


# -- 1. schema, the missing job row, and the phase budget from the journals --------------------------------


def test_db_init_then_run_needs_create_job_then_budget_from_journals(
    tmp_path: Path, postgres_url: str
) -> None:
    schema = _schema(postgres_url)
    env = _env(tmp_path, postgres_url, "job-init")
    init = run_cli("db", "init", env=env)
    assert init.returncode == 0, init.stderr
    assert "schema ready at postgresql://agentlife:***@" in init.stdout
    assert _password(postgres_url) not in init.stdout + init.stderr
    tables = _fetch(
        postgres_url,
        "SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema = ANY($1::text[])",
        [schema, "public"],
    )
    # The URL's search_path is honoured by db init: the tables exist in the test's schema and nowhere else.
    assert {(t["table_schema"], t["table_name"]) for t in tables} == {
        (schema, "job"),
        (schema, "checkpoint_history"),
        (schema, "delivery"),
        (schema, "conversation"),
        (schema, "job_event"),
        (schema, "step_record"),
        (schema, "job_output"),
        (schema, "rate_bucket"),
        (schema, "rate_slot"),
        (schema, "job_pruned"),
    }

    missing = run_cli("run", AGENT, env=env)
    output = missing.stdout + missing.stderr
    assert missing.returncode == 1, output
    errors = _errors(output)
    assert len(errors) == 1, output
    assert "job job-init does not exist" in errors[0] and "--create-job" in errors[0]
    assert "\n" not in errors[0] and "Traceback" not in output
    assert _row(postgres_url, "job-init") is None  # a pod never invents a control-plane row on its own

    # public has no job table, so a run that succeeds went through the URL's search_path as well.
    created = run_cli("run", AGENT, "--create-job", "--payload", '{"ticket": 7}', env=env)
    assert created.returncode == 0, created.stdout + created.stderr
    row = _must_row(postgres_url, "job-init")
    assert (row["status"], row["agent_id"], row["attempt"]) == ("COMPLETED", "durable-agent", 1)
    assert row["payload"] == {"ticket": 7}
    assert row["result"] == {"steps": [0, 1, 2], "by_attempt": 1}
    assert [step for _, step in _history(postgres_url, "job-init")] == [0, 1, 2]

    # The phase budget from the journals of these real runs. The refused run never executed.
    data_dir = tmp_path / "data"
    budget = run_cli("budget", "--from-journals", str(data_dir), env=env)
    assert budget.returncode == 0, budget.stderr
    assert f"1 of 2 session journals under {data_dir} reached execution" in budget.stdout
    expected = derive_total_timeout(*p95_from_journals(data_dir), 180.0)
    assert expected == 240  # well under a minute of init + exec, plus the 180 s default buffer
    assert budget.stdout.splitlines()[-1] == f"rounded up to a multiple of 60 s: {expected} s"


# -- 2. PostgreSQL down --------------------------------------------------------------------------------------


def test_postgres_down_at_boot_three_tries_then_one_line_exit_1(
    tmp_path: Path, postgres_server: PostgresServer, pg_url: str
) -> None:
    env = _env(tmp_path, pg_url, "job-down")
    with postgres_server.stopped():
        result = run_cli("run", AGENT, "--create-job", env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    tries = _msgs(output, "unreachable (try")
    assert [m for t in tries for m in re.findall(r"try \d/\d", str(t["msg"]))] == [
        "try 1/3",
        "try 2/3",
        "try 3/3",
    ]
    gaps = [float(b["ts"]) - float(a["ts"]) for a, b in itertools.pairwise(tries)]
    assert all(gap >= 1.9 for gap in gaps), gaps  # the 2 s backoff between tries
    errors = _errors(output)
    assert len(errors) == 1, output
    assert "store unreachable" in errors[0] and "after 3 tries" in errors[0] and "\n" not in errors[0]
    journal = "".join(p.read_text() for p in (tmp_path / "data").rglob("session_*.jsonl"))
    assert '"exit_code":1' in journal
    assert _password(pg_url) not in output + journal
    assert "Traceback" not in output


def test_postgres_down_mid_run_heartbeats_fail_checkpoint_retries_job_finishes(
    tmp_path: Path, postgres_server: PostgresServer, pg_url: str, live: Callable[..., Live]
) -> None:
    env = _env(
        tmp_path,
        pg_url,
        "job-outage",
        DURABLE_STEPS="12",
        DURABLE_STEP_SECONDS="0.05",
        AGENTLIFE_HEARTBEAT_JOB_INTERVAL_SECONDS="0.2",
        # The checkpoint write retries (1 s, 2 s, 4 s ...) within the step deadline: 8 s leaves room for 3.
        AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS="8",
    )
    proc = live(env, "--create-job")
    work = Path(env["DURABLE_DIR"])
    wait_for(work / "step-1-2-done")
    with postgres_server.stopped():
        proc.wait_log("checkpoint write failed")
        during = proc.wait_status(lambda s: s["heartbeats"].get("job", {}).get("failures", 0) >= 2)
        assert during["state"] == "EXECUTING"
        assert during["heartbeats"]["job"]["ok"] is False
    code = proc.wait()
    output = proc.output
    assert code == 0, output
    row = _must_row(pg_url, "job-outage")
    assert row["status"] == "COMPLETED"
    assert _checkpoint_doc(row)["state"]["done_steps"] == list(range(12))  # no step lost or repeated
    assert row["heartbeat_at"] is not None
    failed_beats = _msgs(output, "job heartbeat for job-outage failed")
    assert len(failed_beats) >= 2
    assert "2 failure(s) so far" in str(failed_beats[1]["msg"])
    assert _msgs(output, "retrying in 1.0s")  # the first checkpoint retry, inside the step budget
    assert _errors(output) == []
    assert _password(pg_url) not in output + str(during)


# -- 3. fencing between two live attempts -------------------------------------------------------------------


@pytest.mark.parametrize("fenced_by", ["checkpoint", "heartbeat"])
def test_stale_attempt_is_fenced_and_never_touches_the_row(
    tmp_path: Path, pg_url: str, live: Callable[..., Live], fenced_by: str
) -> None:
    """Attempt 1 is stuck in step 2 when attempt 2 takes the job over; only attempt 2's writes land.

    ``checkpoint``: attempt 1 finishes its step afterwards and its checkpoint write is refused.
    ``heartbeat``: attempt 1 stays stuck; its next job heartbeat is refused and that stops its step.
    """
    llm = "1" if fenced_by == "heartbeat" else "0"
    common = {"DURABLE_STEPS": "6", "DURABLE_GATE_STEP": "2", "DURABLE_LLM": llm}
    beat = "0.2" if fenced_by == "heartbeat" else "30"
    # Two pods, each with its own data dir: the successor cannot replay the zombie's journal, so every LLM
    # call below is made (and its usage written) by the process that issued it.
    env_a = _env(
        tmp_path,
        pg_url,
        "job-fence",
        1,
        data="pod-a",
        AGENTLIFE_HEARTBEAT_JOB_INTERVAL_SECONDS=beat,
        **common,
    )
    env_b = _env(tmp_path, pg_url, "job-fence", 2, data="pod-b", **common)
    work = Path(env_a["DURABLE_DIR"])
    a = live(env_a, "--create-job")
    wait_for(work / "gate-waiting-1")
    b = live(env_b)
    loaded = b.wait_log("loaded: resuming at step")
    assert "resuming at step 2" in str(loaded["msg"])
    b_checkpoint = str(loaded["checkpoint_id"])
    assert b_checkpoint.startswith("0001-000001-")
    wait_for(work / "gate-waiting-2")
    b.wait_status(lambda s: s["heartbeats"].get("job", {}).get("ok") is True)  # attempt 2's beat has landed

    if fenced_by == "checkpoint":
        before = (_must_row(pg_url, "job-fence"), _history(pg_url, "job-fence"))
        (work / "gate-1").touch()  # attempt 1 finishes step 2 and tries to checkpoint it
        assert a.wait() == 1, a.output
        assert (work / "step-1-2-done").exists()
        assert (_must_row(pg_url, "job-fence"), _history(pg_url, "job-fence")) == before
        assert "write by attempt 1 refused" in " ".join(_errors(a.output))
    else:
        assert a.wait() == 1, a.output  # without the gate ever opening: the heartbeat fence cancelled it
        assert not (work / "step-1-2-done").exists()
        assert "heartbeat by attempt 1 refused" in " ".join(_errors(a.output))
    row = _must_row(pg_url, "job-fence")
    assert (row["attempt"], row["status"], row["checkpoint_id"]) == (2, "RUNNING", b_checkpoint)
    assert _history(pg_url, "job-fence")[-1] == (b_checkpoint, 1)
    # Usage is counted by each step's checkpoint (one commit per step): attempt 1's steps 0-1. Its call
    # in step 2 went with the checkpoint the fence refused (a fenced process writes nothing, usage
    # included), and attempt 2's call of step 2 waits for attempt 2's checkpoint of it.
    assert row["tokens_consumed"]["input"] == (200 if llm == "1" else 0)
    assert "1 3" not in _lines(work / "steps")  # attempt 1's step loop stopped

    (work / "gate-2").touch()
    assert b.wait() == 0, b.output
    row = _must_row(pg_url, "job-fence")
    assert (row["status"], row["attempt"]) == ("COMPLETED", 2)
    assert row["result"] == {"steps": [0, 1, 2, 3, 4, 5], "by_attempt": 2}
    assert row["tokens_consumed"]["input"] == (600 if llm == "1" else 0)  # + attempt 2's steps 2-5
    assert all(cid.startswith("0002-") for cid, step in _history(pg_url, "job-fence") if step >= 2)


# -- 4. delivery across SIGKILLs ----------------------------------------------------------------------------


def test_killed_before_delivery_delivers_once_next_attempt_despite_failing_housekeeping(
    tmp_path: Path, pg_url: str, live: Callable[..., Live]
) -> None:
    env = _env(tmp_path, pg_url, "job-deliver", 1, DURABLE_DELIVER_PAUSE="30")
    work = Path(env["DURABLE_DIR"])
    first = live(env, "--create-job")
    wait_for(work / "deliver-entered-1")
    first.kill()  # the work is done, the side effect of delivery is not
    row = _must_row(pg_url, "job-deliver")
    assert row["status"] == "RUNNING"
    assert _checkpoint_doc(row)["phase"] == "delivering"
    assert _lines(work / "deliveries") == []
    assert _fetch(pg_url, "SELECT key FROM delivery") == []

    env2 = _env(tmp_path, pg_url, "job-deliver", 2, DURABLE_HOUSEKEEPING_FAIL="1")
    second = live(env2)
    assert second.wait() == 0, second.output
    assert _lines(work / "deliveries") == ['2 {"steps":[0,1,2],"by_attempt":1}']
    assert [line for line in _lines(work / "steps") if line.startswith("2 ")] == []  # straight to delivery
    assert (work / "housekeeping-entered-2").exists()
    assert _msgs(second.output, "housekeeping") and "archive bucket unreachable" in second.output
    row = _must_row(pg_url, "job-deliver")
    assert row["status"] == "COMPLETED" and row["result"] == {"steps": [0, 1, 2], "by_attempt": 1}
    assert _fetch(pg_url, "SELECT key, channel FROM delivery") == [
        {"key": "delivery:job-deliver:e2e", "channel": "e2e"}
    ]


def test_killed_after_delivery_before_housekeeping_never_delivers_again(
    tmp_path: Path, pg_url: str, live: Callable[..., Live]
) -> None:
    env = _env(tmp_path, pg_url, "job-delivered", 1, DURABLE_HOUSEKEEPING_PAUSE="30")
    work = Path(env["DURABLE_DIR"])
    first = live(env, "--create-job")
    wait_for(work / "housekeeping-entered-1")
    first.kill()
    assert _lines(work / "deliveries") == ['1 {"steps":[0,1,2],"by_attempt":1}']
    assert _fetch(pg_url, "SELECT key FROM delivery") == [{"key": "delivery:job-delivered:e2e"}]

    # Whatever the row says (a control plane that missed the status re-queues the job), the registry decides.
    _fetch(pg_url, "UPDATE job SET status = 'RETRYING' WHERE id = 'job-delivered'")
    second = live(_env(tmp_path, pg_url, "job-delivered", 2))
    assert second.wait() == 0, second.output
    assert _msgs(second.output, "delivery already recorded: not delivered again")
    assert not (work / "deliver-entered-2").exists()
    assert _lines(work / "deliveries") == ['1 {"steps":[0,1,2],"by_attempt":1}']
    assert [line for line in _lines(work / "steps") if line.startswith("2 ")] == []
    assert _must_row(pg_url, "job-delivered")["status"] == "COMPLETED"


# -- 5. crash policy from the row real attempts left ---------------------------------------------------------


def test_crash_history_drives_backoff_and_oom_reduces_the_footprint(
    tmp_path: Path, pg_url: str, live: Callable[..., Live]
) -> None:
    job = "job-crashy"
    delays: list[float] = []
    for attempt, message in ((1, "search backend returned 502"), (2, "search backend returned 503")):
        env = _env(tmp_path, pg_url, job, attempt, DURABLE_CRASH_STEP="1", DURABLE_CRASH_MESSAGE=message)
        proc = live(env, "--create-job")
        assert proc.wait() == 1, proc.output
        row = _must_row(pg_url, job)
        last = row["error"][-1]
        assert (last["attempt"], last["exit_code"], last["error_class"], last["step"]) == (
            attempt,
            1,
            "RuntimeError",
            1,
        )
        assert message in last["message"]
        decision = should_retry_after_crash(row["error"], row["token_budget"], row["tokens_consumed"])
        assert decision.retry and not decision.footprint_reduced
        delays.append(decision.delay_seconds)

    # Attempt 3 is OOM-killed mid-step; the kubelet reports 137 and the control plane records it.
    env = _env(tmp_path, pg_url, job, 3, DURABLE_GATE_STEP="1")
    work = Path(env["DURABLE_DIR"])
    oom = live(env)
    wait_for(work / "gate-waiting-3")
    oom.kill()
    exit_code = 128 + signal.SIGKILL
    record = {
        "exit_code": exit_code,
        "error_class": "OOMKilled",
        "message": "OOMKilled",
        "at": time.time(),
        "attempt": 3,
    }
    _fetch(
        pg_url,
        "UPDATE job SET error = error || $1::jsonb WHERE id = $2",
        orjson.dumps([record]).decode(),
        job,
    )
    row = _must_row(pg_url, job)
    decision = should_retry_after_crash(row["error"], row["token_budget"], row["tokens_consumed"])
    assert decision.retry and decision.footprint_reduced
    delays.append(decision.delay_seconds)
    assert delays == [5.0, 60.0, 300.0]  # the escalating schedule, one step per recorded crash

    final = live(_env(tmp_path, pg_url, job, 4, AGENTLIFE_PREVIOUS_EXIT_CODE=str(exit_code)))
    assert final.wait() == 0, final.output
    seen = {n: orjson.loads((work / f"footprint-{n}.json").read_bytes()) for n in (1, 4)}
    assert seen[1] == {
        "reduced": False,
        "max_context_tokens": 200_000,
        "browser_enabled": True,
        "max_concurrent_tools": 8,
    }
    assert seen[4] == {
        "reduced": True,
        "max_context_tokens": 50_000,
        "browser_enabled": False,
        "max_concurrent_tools": 1,
    }
    row = _must_row(pg_url, job)
    assert row["status"] == "COMPLETED" and row["result"] == {"steps": [0, 1, 2], "by_attempt": 4}
    assert [(e["attempt"], e["exit_code"]) for e in row["error"]] == [(1, 1), (2, 1), (3, 137)]
