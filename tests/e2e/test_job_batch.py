"""``job retry|cancel|pause|resume`` over a selection, by the command line (SQLite: the store is the same
code as `agentlife._jobs._batch`'s tests on both stores; what is tested here is the command).

Most run the command in this process (`cli_in_process`); one real process is sent SIGTERM mid-batch.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import orjson

from procs import REPO, agent_env, cli_in_process
from world import init_schema

EXIT_USAGE, EXIT_NOT_FOUND, EXIT_CONFLICT = 2, 3, 4


def _store(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    db = tmp_path / "jobs.db"
    url = f"sqlite:///{db}"
    init_schema(url)
    return db, agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=url)


def _rows(db: Path, ids: list[str], status: str, agent: str = "mailer", age: float = 0.0) -> None:
    """Job rows written straight into the table (cheap: 100 000 in about a second)."""
    now = time.time() - age
    error = orjson.dumps([{"at": now, "attempt": 1, "exit_code": 1, "error_class": "Boom"}]).decode()
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO job (id, agent_id, status, payload, attempt, updated_at, error) "
            "VALUES (?, ?, ?, 'null', 1, ?, ?)",
            [(job_id, agent, status, now, error) for job_id in ids],
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def _statuses(db: Path) -> dict[str, str]:
    conn = sqlite3.connect(db)
    try:
        return dict(conn.execute("SELECT id, status FROM job").fetchall())
    finally:
        conn.close()


def _history(db: Path, job_id: str) -> list[dict[str, object]]:
    conn = sqlite3.connect(db)
    try:
        return list(json.loads(conn.execute("SELECT error FROM job WHERE id = ?", (job_id,)).fetchone()[0]))
    finally:
        conn.close()


def _one_line(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_a_batch_retry_of_200_dead_lettered_jobs_is_shown_confirmed_done_once_and_recorded(
    tmp_path: Path,
) -> None:
    db, env = _store(tmp_path)
    ids = [f"mail-{n:03d}" for n in range(200)]
    _rows(db, ids, "DEAD_LETTER")
    _rows(db, ["other-1"], "DEAD_LETTER", agent="reviewer")
    _rows(db, ["running-1"], "RUNNING")

    dry = cli_in_process("job", "retry", "--agent", "mailer", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [*ids, "would retry 200 jobs; nothing changed (--dry-run)"]
    refused = cli_in_process("job", "retry", "--agent", "mailer", env=env)  # no --yes, no terminal
    _one_line(refused, EXIT_USAGE, "would act on 200 jobs: pass --yes")
    assert set(_statuses(db).values()) == {"DEAD_LETTER", "RUNNING"}

    done = cli_in_process("job", "retry", "--agent", "mailer", "--yes", "--actor", "oncall@ops", env=env)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[:-1] == [f"retry {job_id}: PENDING, attempt 1" for job_id in ids]
    assert out[-1] == "retry: 200 done, 0 skipped"
    statuses = _statuses(db)
    assert {statuses[j] for j in ids} == {"PENDING"}
    assert (statuses["other-1"], statuses["running-1"]) == ("DEAD_LETTER", "RUNNING")
    marker = _history(db, "mail-123")[-1]
    assert (marker["event"], marker["actor"]) == ("retry", "oncall@ops")
    again = cli_in_process("job", "retry", "--agent", "mailer", "--yes", env=env)
    _one_line(again, EXIT_NOT_FOUND, "no job matches the selection (--agent mailer)")
    shown = cli_in_process("job", "show", "mail-007", env=env).stdout
    assert "retry by oncall@ops: retried by an operator" in shown


def test_selections_and_flags_that_are_not_right_are_one_line_errors_and_change_nothing(
    tmp_path: Path,
) -> None:
    db, env = _store(tmp_path)
    _rows(db, ["a-1", "a-2"], "PENDING")
    _rows(db, ["old-1"], "PENDING", age=8 * 86400)
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("# from the incident channel\na-1\n\nold-1\na-1\n")
    bad_file = tmp_path / "bad.txt"
    bad_file.write_text("a-1\n../etc/passwd\n")
    before = _statuses(db)
    cases = [
        (("job", "cancel"), EXIT_USAGE, "give a job ID, or select jobs"),
        (("job", "cancel", "a-1", "--status", "PENDING"), EXIT_USAGE, "not both"),
        (("job", "cancel", "--older-than", "7 days"), EXIT_USAGE, "is not an age"),
        (("job", "cancel", "--older-than=-1d"), EXIT_USAGE, "is not an age"),
        (("job", "retry", "--status", "PENDING"), EXIT_USAGE, "retry acts on FAILED, DEAD_LETTER jobs"),
        (("job", "cancel", "--status", "PENDING", "--limit", "0"), EXIT_USAGE, "--limit 0"),
        (("job", "cancel", "--status", "PENDING", "--limit", "2", "--yes"), EXIT_USAGE, "more than 2 jobs"),
        (("job", "cancel", "--ids-file", str(bad_file)), EXIT_USAGE, "line 2 of the ids file"),
        (("job", "cancel", "--ids-file", str(tmp_path / "none")), EXIT_USAGE, "cannot be read"),
        (("job", "cancel", "--agent", "nobody", "--yes"), EXIT_NOT_FOUND, "no job matches"),
        (("job", "resume", "--status", "PENDING"), EXIT_USAGE, "resume acts on PAUSED, RUNNING jobs"),
        (("job", "cancel", "--status", "PENDING", "--actor", "a\nb", "--yes"), EXIT_USAGE, "--actor"),
    ]
    for args, code, needle in cases:
        _one_line(cli_in_process(*args, env=env), code, needle)
    assert _statuses(db) == before
    old = cli_in_process("job", "cancel", "--older-than", "7d", "--dry-run", env=env)
    assert old.stdout.splitlines() == ["old-1", "would cancel 1 jobs; nothing changed (--dry-run)"]
    chosen = cli_in_process("job", "cancel", "--ids-file", str(ids_file), "--reason", "dup", "--yes", env=env)
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.splitlines()[-1] == "cancel: 2 done, 0 skipped"
    assert _statuses(db) == {"a-1": "FAILED", "a-2": "PENDING", "old-1": "FAILED"}
    # One job is one job: no --yes needed, and the single-ID form is unchanged.
    assert cli_in_process("job", "pause", "--agent", "mailer", env=env).returncode == 0
    assert _statuses(db)["a-2"] == "PAUSED"
    resumed = cli_in_process("job", "resume", "a-2", env=env)
    assert (resumed.returncode, resumed.stdout) == (0, "job a-2 resumed: PENDING\n"), resumed.stderr


def test_a_selection_of_100_000_jobs_is_refused_past_the_limit_and_nothing_changes(tmp_path: Path) -> None:
    db, env = _store(tmp_path)
    _rows(db, [f"bulk-{n:06d}" for n in range(100_000)], "PENDING")
    refused = cli_in_process("job", "cancel", "--status", "PENDING", "--yes", env=env)
    _one_line(refused, EXIT_USAGE, "matches more than 10000 jobs", "raise the limit (at most 100000)")
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT count(*) FROM job WHERE status = 'PENDING'").fetchone() == (100_000,)
    finally:
        conn.close()
    over = cli_in_process("job", "cancel", "--status", "PENDING", "--limit", "100001", env=env)
    _one_line(over, EXIT_USAGE, "--limit 100001 must be from 1 to 100000")


def test_sigterm_mid_batch_leaves_each_job_acted_on_or_untouched_and_said_what_it_did(tmp_path: Path) -> None:
    db, env = _store(tmp_path)
    ids = [f"dl-{n:04d}" for n in range(500)]
    _rows(db, ids, "DEAD_LETTER")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentlife", "job", "retry", "--status", "DEAD_LETTER", "--yes"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # the batch has started: the first job is done and said
    assert first.startswith("retry dl-"), first
    proc.send_signal(signal.SIGTERM)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err)
    said = {
        line.split()[1].rstrip(":") for line in [first, *rest.splitlines()] if line.startswith("retry dl-")
    }
    statuses = _statuses(db)
    retried = {job_id for job_id in ids if statuses[job_id] == "PENDING"}
    assert said <= retried and 0 < len(retried) < len(ids), (len(said), len(retried))
    for job_id in ids:
        markers = [e for e in _history(db, job_id) if e.get("event") == "retry"]
        assert len(markers) == (1 if job_id in retried else 0), job_id
        assert statuses[job_id] in ("PENDING", "DEAD_LETTER")
    # What was not done is done by running the same command again: each job exactly once.
    again = cli_in_process("job", "retry", "--status", "DEAD_LETTER", "--yes", env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == f"retry: {len(ids) - len(retried)} done, 0 skipped"
    assert set(_statuses(db).values()) == {"PENDING"}
