"""``python -m agentlife job ...`` and ``reap``, on SQLite and on a real PostgreSQL.

A command given input on stdin, and the tests that run commands by `run_cli`, start real processes; the
others run the command line in this process (`cli_in_process`: the same parser, handlers, output and exit
codes, without a third of a CPU second of interpreter start each).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentlife._jobs._actor import default_actor
from agentlife.stores import CheckpointStore, store_from_url
from procs import agent_env, cli_in_process, run_cli
from world import init_schema

EXIT_USAGE, EXIT_NOT_FOUND, EXIT_CONFLICT = 2, 3, 4


@dataclass
class Cli:
    url: str
    data_dir: Path
    env: dict[str, str]

    def __call__(self, *args: str, stdin: str | None = None) -> Any:
        if stdin is None:
            return cli_in_process(*args, env=self.env)
        import subprocess
        import sys

        from procs import REPO

        return subprocess.run(
            [sys.executable, "-m", "agentlife", *args],
            env=self.env,
            cwd=REPO,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def store(self) -> CheckpointStore:
        return store_from_url(self.url)

    def with_store(self, fn: Any) -> Any:
        async def go() -> Any:
            store = self.store()
            await store.open()
            try:
                return await fn(store)
            finally:
                await store.close()

        return anyio.run(go)

    def sql(self, statement: str, *args: Any) -> None:
        if self.url.startswith("sqlite"):
            import sqlite3

            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), isolation_level=None)
            try:
                for n in range(len(args), 0, -1):
                    statement = statement.replace(f"${n}", "?")
                conn.execute(statement, args)
            finally:
                conn.close()
            return

        async def go() -> None:
            import asyncpg

            conn = await asyncpg.connect(self.url)
            try:
                await conn.execute(statement, *args)
            finally:
                await conn.close()

        anyio.run(go)


@pytest.fixture(params=["sqlite", "postgresql"])
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Cli:
    data_dir = tmp_path / "data"
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    env = agent_env(data_dir, AGENTLIFE_DATABASE_URL=url)
    init_schema(url)  # `db init` in this process; the command's own test is below
    return Cli(url, data_dir, env)


def _one_line_error(proc: Any, code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


# -- happy paths -------------------------------------------------------------------------------------------


def test_create_from_each_payload_source_then_list_and_show(cli: Cli, tmp_path: Path) -> None:
    made = cli("job", "create", "reviewer", "--id", "j-arg", "--payload", '{"repo": "acme/x", "n": 1}')
    assert (made.returncode, made.stdout) == (0, "j-arg\n"), made.stderr
    assert (
        cli(
            "job", "create", "reviewer", "--id", "j-stdin", "--payload", "-", stdin='{"from": "stdin"}'
        ).returncode
        == 0
    )
    payload_file = tmp_path / "payload.json"
    payload_file.write_text('{"from": "file", "big": 12345678901234567890}')
    assert (
        cli("job", "create", "other", "--id", "j-file", "--payload-file", str(payload_file)).returncode == 0
    )
    generated = cli("job", "create", "other", "--max-cost-usd", "2.5", "--max-input-tokens", "1000")
    assert generated.returncode == 0 and generated.stdout.startswith("job-"), generated.stderr
    new_id = generated.stdout.strip()

    rows = {r["id"]: r for r in map(json.loads, cli("job", "list", "--json").stdout.splitlines())}
    assert set(rows) == {"j-arg", "j-stdin", "j-file", new_id}
    assert rows["j-arg"]["payload"] == {"repo": "acme/x", "n": 1}
    assert rows["j-stdin"]["payload"] == {"from": "stdin"}
    assert rows["j-file"]["payload"] == {"from": "file", "big": 12345678901234567890}
    assert rows[new_id]["token_budget"] == {"max_cost_usd": 2.5, "max_input_tokens": 1000}
    assert {r["status"] for r in rows.values()} == {"PENDING"}

    by_agent = cli("job", "list", "--agent", "other", "--json").stdout.splitlines()
    assert {json.loads(r)["id"] for r in by_agent} == {"j-file", new_id}
    table = cli("job", "list", "--status", "pending").stdout.splitlines()
    assert table[0].split() == ["ID", "AGENT", "STATUS", "ATTEMPT", "UPDATED", "CRASHES", "PRIORITY", "KEY"]
    assert len(table) == 5
    assert cli("job", "list", "--status", "FAILED").stdout.splitlines()[1:] == []

    shown = cli("job", "show", "j-arg")
    assert shown.returncode == 0, shown.stderr
    assert "status      PENDING" in shown.stdout and '"repo": "acme/x"' in shown.stdout
    assert "crash history (0)" in shown.stdout and "journal: none under" in shown.stdout


def test_approve_reject_cancel_retry(cli: Cli) -> None:
    for job_id in ("parked-1", "parked-2", "running"):
        assert cli("job", "create", "reviewer", "--id", job_id).returncode == 0
    cli.sql("UPDATE job SET status = 'WAITING_FOR_APPROVAL' WHERE id IN ('parked-1', 'parked-2')")

    approved = cli("job", "approve", "parked-1")
    assert approved.returncode == 0, approved.stderr
    assert "approved: PENDING" in approved.stdout
    rejected = cli("job", "reject", "parked-2", "--reason", "too risky")
    assert (rejected.returncode, rejected.stdout) == (0, "job parked-2 rejected: FAILED\n")
    row = cli.with_store(lambda s: s.get_job("parked-2"))
    assert (row.status, row.error[-1]["error_class"], row.error[-1]["message"]) == (
        "FAILED",
        "ApprovalRejected",
        "too risky",
    )

    claimed = cli.with_store(lambda s: s.claim("running", 1))
    assert claimed.status == "RUNNING"
    cancelled = cli("job", "cancel", "running", "--reason", "not needed")
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancelled: FAILED, attempt 2" in cancelled.stdout
    retried = cli("job", "retry", "running")
    assert (retried.returncode, retried.stdout) == (0, "job running will run again: PENDING, attempt 2\n")
    shown = cli("job", "show", "running").stdout
    assert "crash history (2)" in shown and f"Cancelled by {default_actor()}: not needed" in shown
    assert f"retry by {default_actor()}" in shown


def test_each_action_records_the_actor_given_and_a_bad_one_changes_nothing(cli: Cli) -> None:
    for job_id in ("parked", "parked-2", "done"):
        assert cli("job", "create", "reviewer", "--id", job_id).returncode == 0
    cli.sql("UPDATE job SET status = 'WAITING_FOR_APPROVAL' WHERE id IN ('parked', 'parked-2')")
    for bad in ("", "alice\nFAILED by root", "a\u202eb", "x" * 201, "y" * 10_240):
        refused = cli("job", "cancel", "done", "--actor", bad)
        _one_line_error(refused, EXIT_USAGE, "--actor")
    row = cli.with_store(lambda s: s.get_job("done"))
    assert (row.status, row.error) == ("PENDING", [])

    assert cli("job", "cancel", "done", "--actor", "alice@ops", "--reason", "dup").returncode == 0
    assert cli("job", "retry", "done", "--actor", "bob").returncode == 0
    assert cli("job", "reject", "parked-2", "--actor", "carol").returncode == 0
    assert cli("job", "approve", "parked", "--actor", "dave").returncode == 0
    row = cli.with_store(lambda s: s.get_job("done"))
    assert [(e.get("error_class") or e.get("event"), e["actor"]) for e in row.error] == [
        ("Cancelled", "alice@ops"),
        ("retry", "bob"),
    ]
    shown = cli("job", "show", "done").stdout
    assert "Cancelled by alice@ops: dup" in shown and "retry by bob: retried by an operator" in shown
    assert "ApprovalRejected by carol: approval rejected" in cli("job", "show", "parked-2").stdout
    approval = cli.with_store(lambda s: s.get_approval("parked-2"))
    assert approval.rejection["rejected_by"] == "carol"


def test_show_prints_the_last_journal_events(cli: Cli) -> None:
    assert cli("job", "create", "reviewer", "--id", "j-1").returncode == 0
    session = cli.data_dir / "sessions" / "j-1"
    session.mkdir(parents=True)
    now = time.time()
    events = [
        {"v": 1, "ts": now, "seq": 1, "type": "SESSION_STARTED", "job_id": "j-1", "attempt": 1},
        *({"v": 1, "ts": now + i, "seq": 1 + i, "type": "STEP_STARTED", "step": i} for i in range(1, 30)),
    ]
    (session / "session_0001_1000.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    shown = cli("job", "show", "j-1", "--events", "3")
    assert shown.returncode == 0, shown.stderr
    tail = shown.stdout.split("journal ", 1)[1].splitlines()
    assert "session_0001_1000.jsonl (1 session)" in tail[0]
    assert "30 events" in tail[1]
    assert len(tail) == 5 and "29" in tail[-1]


def test_reap_moves_a_stale_running_job_to_retrying(cli: Cli) -> None:
    assert cli("job", "create", "reviewer", "--id", "zombie").returncode == 0
    assert cli("job", "create", "reviewer", "--id", "alive").returncode == 0
    cli.with_store(lambda s: s.claim("zombie", 1))
    cli.with_store(lambda s: s.claim("alive", 1))
    stale = time.time() - 3600
    if cli.url.startswith("sqlite"):
        cli.sql("UPDATE job SET heartbeat_at = $1 WHERE id = 'zombie'", stale)
    else:
        cli.sql("UPDATE job SET heartbeat_at = now() - interval '1 hour' WHERE id = 'zombie'")
    reaped = cli("reap", "--threshold", "300")
    assert reaped.returncode == 0, reaped.stderr
    lines = reaped.stdout.splitlines()
    assert lines[-1] == "reaped 1 job (threshold 300 s)"
    assert lines[0].startswith("zombie (agent reviewer): heartbeat stale for ")
    assert "-> RETRYING, next attempt 2 not before " in lines[0]
    row = cli.with_store(lambda s: s.get_job("zombie"))
    assert (row.status, row.attempt, row.error[-1]["reason"]) == ("RETRYING", 1, "heartbeat stale")
    assert cli.with_store(lambda s: s.get_job("alive")).status == "RUNNING"
    again = cli("reap")
    assert (again.returncode, again.stdout) == (0, "reaped 0 jobs (threshold 300 s)\n")
    # A threshold under two heartbeat periods would reap live jobs: refused.
    _one_line_error(
        cli("reap", "--threshold", "59"), EXIT_USAGE, "must be >= 2 x the job heartbeat interval = 60 s"
    )


# -- error paths -------------------------------------------------------------------------------------------


def test_bad_job_ids_are_usage_errors(cli: Cli) -> None:
    for bad in ("../x", ".hidden", "a/b", "x" * 200, ""):
        _one_line_error(cli("job", "create", "reviewer", "--id", bad), EXIT_USAGE, "is not allowed")
    for command in ("show", "approve", "cancel", "retry", "reject"):
        _one_line_error(cli("job", command, "../x"), EXIT_USAGE, "job id '../x' is not allowed")
    assert cli("job", "list", "--json").stdout == ""


def test_unknown_jobs_exit_not_found(cli: Cli) -> None:
    for command in ("show", "approve", "reject", "cancel", "retry"):
        _one_line_error(cli("job", command, "ghost"), EXIT_NOT_FOUND, "job ghost does not exist")


def test_wrong_status_exits_conflict_naming_the_status(cli: Cli) -> None:
    assert cli("job", "create", "reviewer", "--id", "j-1").returncode == 0
    _one_line_error(cli("job", "approve", "j-1"), EXIT_CONFLICT, "cannot approve job j-1: it is PENDING")
    _one_line_error(cli("job", "reject", "j-1"), EXIT_CONFLICT, "it is PENDING")
    _one_line_error(cli("job", "retry", "j-1"), EXIT_CONFLICT, "cannot retry job j-1: it is PENDING")
    _one_line_error(cli("job", "create", "reviewer", "--id", "j-1"), EXIT_CONFLICT, "j-1 already exists")
    cli.sql("UPDATE job SET status = 'COMPLETED' WHERE id = 'j-1'")
    _one_line_error(cli("job", "cancel", "j-1"), EXIT_CONFLICT, "it is COMPLETED")


MALFORMED = [
    (("--payload", "{bad"), None, "--payload is not valid JSON"),
    (("--payload", "NaN"), None, "not a JSON number"),
    (("--payload", "-"), "[1, 2", "stdin is not valid JSON"),
    (("--payload-file", "/nonexistent/p.json"), None, "payload file not found"),
    (("--payload", "{}", "--payload-file", "x"), None, "not allowed with argument"),
    # PostgreSQL's JSON cannot store U+0000: refused on both stores alike, not an internal error on one.
    (("--payload", '"\\u0000"'), None, "--payload holds U+0000 in a string"),
    (("--payload", '{"\\u0000k": 1}'), None, "--payload holds U+0000 in a string"),
    (("--payload", "-"), '"' + "x" * (1024 * 1024) + '"', "bytes of JSON, more than 1048576"),
    (("--max-cost-usd", "-1"), None, "must be a finite number > 0"),
    (
        ("--max-input-tokens", str(2**64)),
        None,
        "--max-input-tokens 18446744073709551616 must be >= 1 and <=",
    ),
    (("--concurrency-key", "tenant\x1b[2J"), None, "--concurrency-key holds the control character U+001B"),
    (("--priority", str(2**63)), None, "--priority='9223372036854775808' is not a whole number from -1000"),
]


def test_malformed_payloads_are_usage_errors(cli: Cli) -> None:
    # One test per store, not one per case: each case is its own process and error line all the same.
    for args, stdin, needle in MALFORMED:
        _one_line_error(cli("job", "create", "reviewer", *args, stdin=stdin), EXIT_USAGE, needle)
    assert cli("job", "list", "--json").stdout == ""  # nothing of any of them was kept


def test_a_postgres_table_from_before_job_operations_asks_for_db_init(
    postgres_url: str, tmp_path: Path
) -> None:
    # SQLite migrates on every open; a PostgreSQL pod need not hold DDL rights, so `db init` does it.
    cli = Cli(postgres_url, tmp_path, agent_env(tmp_path, AGENTLIFE_DATABASE_URL=postgres_url))
    assert cli("db", "init").returncode == 0
    cli.sql("DROP INDEX job_claim_idx")
    cli.sql("DROP INDEX job_agent_due_idx")
    cli.sql("ALTER TABLE job DROP COLUMN not_before")
    _one_line_error(cli("job", "list"), 1, "run `python -m agentlife db init`")
    assert cli("db", "init").returncode == 0
    assert cli("job", "list").returncode == 0


def test_manifest_payload_reaches_every_scheduled_run(tmp_path: Path) -> None:
    env = agent_env(tmp_path)
    base = ("manifest", "--image", "x:1", "--agent", "m:C", "--schedule", "0 9 * * 1-5")
    budget = ("--init-p95", "30", "--exec-p95", "300")
    out = cli_in_process(*base, *budget, "--payload", '{"repo": "acme/x"}', "-o", "json", env=env)
    assert out.returncode == 0, out.stderr
    container = json.loads(out.stdout)["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][-3:] == ["--create-job", "--payload", '{"repo":"acme/x"}']
    _one_line_error(
        cli_in_process(*base, *budget, "--payload", "{bad", env=env), EXIT_USAGE, "not valid JSON"
    )


# -- where the store is ------------------------------------------------------------------------------------


def test_commands_that_read_jobs_never_create_a_store(tmp_path: Path) -> None:
    # What the commands print and leave on disk, in this process (`cli_in_process`): nothing here is about
    # the process, and a `job` process start costs about a third of a CPU second.
    env = agent_env(tmp_path / "data")
    missing = tmp_path / "typo.db"
    for args in (("job", "list"), ("job", "show", "j-1"), ("job", "cancel", "j-1"), ("reap",)):
        done = cli_in_process(*args, "--database-url", f"sqlite:///{missing}", env=env)
        _one_line_error(done, 1, f"no store at {missing}", "db init")
        assert not missing.exists() and not (tmp_path / "data").exists()
    # The embedded default is no exception.
    _one_line_error(
        cli_in_process("job", "list", env=env), 1, f"no store at {tmp_path / 'data' / 'agentlife.db'}"
    )
    assert not (tmp_path / "data").exists()
    # sqlite:///tmp/x.db is relative: the error says where it looked and how to write the absolute path.
    relative = cli_in_process("job", "list", "--database-url", "sqlite:///tmp/typo-nowhere.db", env=env)
    _one_line_error(relative, 1, "sqlite:///tmp/typo-nowhere.db is relative to the current directory")
    assert "for /tmp/typo-nowhere.db write sqlite:////tmp/typo-nowhere.db" in relative.stderr
    # A file that is not a store is refused, and left exactly as it was (no WAL switch, no tables).
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE notes (x TEXT)")
    conn.commit()
    conn.close()
    before = other.read_bytes()
    _one_line_error(
        cli_in_process("job", "list", "--database-url", f"sqlite:///{other}", env=env),
        1,
        "it holds no job table",
    )
    assert other.read_bytes() == before
    # `job create` is the one that may create it; then the others find it.
    made = cli_in_process(
        "job", "create", "reviewer", "--job-id", "j-1", "--database-url", f"sqlite:///{missing}", env=env
    )
    assert made.returncode == 0, made.stderr
    listed = cli_in_process("job", "list", "--database-url", f"sqlite:///{missing}", env=env)
    assert listed.returncode == 0 and "j-1" in listed.stdout, listed.stderr


def test_create_takes_job_id_and_refuses_an_agent_id_no_worker_could_claim(cli: Cli) -> None:
    for flag in ("--job-id", "--id"):
        made = cli("job", "create", "reviewer", flag, f"j{flag}")
        assert (made.returncode, made.stdout) == (0, f"j{flag}\n"), made.stderr
    for bad in ("a'; DROP TABLE job; --", "has space", ".leading-dot", "a/b", "x" * 129, "ünï", ""):
        _one_line_error(cli("job", "create", bad), EXIT_USAGE, "is not allowed", "no worker could take")
    assert {json.loads(r)["id"] for r in cli("job", "list", "--json").stdout.splitlines()} == {
        "j--job-id",
        "j--id",
    }


def test_list_limit_out_of_range_is_a_usage_error(cli: Cli) -> None:
    for limit in ("0", "-1", str(2**31), str(2**63), str(2**64)):
        _one_line_error(cli("job", "list", "--limit", limit), EXIT_USAGE, f"--limit {limit} must be >= 1")


def test_list_takes_the_largest_limit(cli: Cli) -> None:
    assert cli("job", "create", "reviewer", "--id", "j-1").returncode == 0
    listed = cli("job", "list", "--limit", str(2**31 - 1))
    assert listed.returncode == 0 and "j-1" in listed.stdout, listed.stderr


def test_run_and_worker_take_database_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    env = agent_env(tmp_path / "data", WORKER_DIR=str(tmp_path))
    for job_id in ("by-run", "by-worker"):
        made = run_cli("job", "create", "worker-agent", "--job-id", job_id, "--database-url", url, env=env)
        assert made.returncode == 0, made.stderr
    ran = run_cli(
        "run", "agents.worker_agent:WorkerAgent", "--job-id", "by-run", "--database-url", url, env=env
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    worked = run_cli(
        "worker", "agents.worker_agent:WorkerAgent", "--max-jobs", "1", "--database-url", url, env=env
    )
    assert worked.returncode == 0, worked.stdout + worked.stderr
    rows = {
        r["id"]: r["status"]
        for r in map(
            json.loads, run_cli("job", "list", "--json", "--database-url", url, env=env).stdout.splitlines()
        )
    }
    assert rows == {"by-run": "COMPLETED", "by-worker": "COMPLETED"}
    assert not (tmp_path / "data" / "agentlife.db").exists()  # the default store was never touched
    bad = run_cli("worker", "agents.worker_agent:WorkerAgent", "--database-url", "mysql://x", env=env)
    _one_line_error(bad, EXIT_USAGE, "--database-url scheme 'mysql' is not supported")
    bad = run_cli(
        "run", "agents.worker_agent:WorkerAgent", "--job-id", "x", "--database-url", "sqlite:", env=env
    )
    _one_line_error(bad, EXIT_USAGE, "--database-url='sqlite:' names no database file")


def test_the_list_table_and_the_confirmations_mask_what_job_show_masks(cli: Cli) -> None:
    # Found by an outside trial: an API key fits the id rules, and `job show` printed `***` where the list
    # table and the cancel, retry and send lines printed it whole.
    key = "sk-ant-api03-" + "Zx9" * 10
    cli.env["ANTHROPIC_API_KEY"] = key
    assert cli("job", "create", key, "--job-id", "k1").returncode == 0
    listed = cli("job", "list")
    assert listed.returncode == 0 and "k1" in listed.stdout and key not in listed.stdout, listed.stdout
    sent = cli("job", "send", "k1", key[:40], "--payload", "1")
    cancelled = cli("job", "cancel", "k1", "--reason", f"leaked {key}")
    retried = cli("job", "retry", "k1")
    for done in (sent, cancelled, retried):
        assert done.returncode == 0 and key[:20] not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "job k1 cancelled: FAILED, attempt 1" in cancelled.stdout


def test_list_json_prints_bytes_another_client_wrote_as_hex(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    env = agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=url)
    init_schema(url)
    assert cli_in_process("job", "create", "agent", "--job-id", "b1", env=env).returncode == 0
    assert cli_in_process("job", "create", "agent", "--job-id", "b2", env=env).returncode == 0
    conn = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None)
    try:
        conn.execute("UPDATE job SET checkpoint_id = X'FF41' WHERE id = 'b1'")
    finally:
        conn.close()
    shown = cli_in_process("job", "list", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    rows = {r["id"]: r for r in map(json.loads, shown.stdout.splitlines())}
    assert set(rows) == {"b1", "b2"} and rows["b1"]["checkpoint_id"] == "hex:ff41"


def test_a_reader_that_closes_the_pipe_early_ends_job_list_quietly_with_141(tmp_path: Path) -> None:
    import subprocess
    import sys

    from procs import REPO

    env = agent_env(tmp_path)
    assert cli_in_process("db", "init", env=env).returncode == 0
    assert cli_in_process("job", "create", "some-agent", "--job-id", "piped-1", env=env).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentlife", "job", "list", "--json"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # `| head -c 0`: the reader is gone before the first line is written
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err.decode()) == (141, "")
