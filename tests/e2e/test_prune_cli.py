"""``python -m agentlife job prune``: its input, its dry run, a pruned id, journals, and a prune SIGKILLed.

Everything but the kill runs the command line in this process (`cli_in_process`); the kill is one real
process. Each test runs on one store in the suite (the store fixture's tier rule), both in the exhaustive run.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_job_cli import Cli, _one_line_error

from agentlife.stores import TableNames
from agentlife.stores._prune import job_tables
from procs import REPO, agent_env
from world import init_schema

EXIT_USAGE, EXIT_NOT_FOUND, EXIT_CONFLICT = 2, 3, 4
T = TableNames()
OLD = time.time() - 3 * 86400.0


@pytest.fixture(params=["sqlite", "postgresql"])
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Cli:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_url")
    init_schema(url)
    return Cli(url, tmp_path / "data", agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=url))


def _tables(cli: Cli) -> tuple[str, ...]:
    return job_tables(T, delta=cli.url.startswith("sqlite"))


def _query(cli: Cli, statement: str) -> list[tuple[Any, ...]]:
    if cli.url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(cli.url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            return [tuple(r) for r in conn.execute(statement).fetchall()]
        finally:
            conn.close()

    async def go() -> list[tuple[Any, ...]]:
        import asyncpg

        conn = await asyncpg.connect(cli.url)
        try:
            return [tuple(r) for r in await conn.fetch(statement)]
        finally:
            await conn.close()

    return anyio.run(go)


def _jobs(cli: Cli, ids: list[str], status: str, at: float) -> None:
    """Job rows of ``status`` last written at ``at``, each with a row in every table keyed by a job."""
    sqlite = cli.url.startswith("sqlite")
    when: Any = at if sqlite else datetime.fromtimestamp(at, UTC)
    rows = {
        T.job: ("id, agent_id, status, updated_at, not_before", [(i, "a", status, when, when) for i in ids]),
        T.checkpoint_history: (
            "job_id, checkpoint_id, step, checkpoint, crc, created_at",
            [(i, "c1", 1, b"x", 1, when) for i in ids],
        ),
        T.conversation: ("job_id, seq, step, message", [(i, 0, 1, b"m") for i in ids]),
        T.event: ("job_id, name, payload, sent_at", [(i, "e", "1", when) for i in ids]),
        T.step_record: ("job_id, step, attempt, session, seq, data", [(i, 1, 1, 1, 0, b"{}") for i in ids]),
        T.output: ("job_id, seq, kind, name, value, at", [(i, 1, "event", "n", "1", when) for i in ids]),
        T.delivery: ("key, job_id, channel, delivered_at", [(f"k-{i}", i, "c", when) for i in ids]),
    }
    if sqlite:
        import sqlite3

        rows[T.output_delta] = ("job_id, slot, seq, at, data", [(i, 0, 1, at, "d") for i in ids])
        conn = sqlite3.connect(cli.url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            conn.execute("BEGIN")
            for table, (columns, values) in rows.items():
                marks = ", ".join("?" * len(values[0]))
                conn.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", values)
            conn.execute("COMMIT")
        finally:
            conn.close()
        return

    async def go() -> None:
        import asyncpg

        conn = await asyncpg.connect(cli.url)
        try:
            async with conn.transaction():
                for table, (columns, values) in rows.items():
                    marks = ", ".join(f"${n + 1}" for n in range(len(values[0])))
                    if table == T.event:
                        marks = marks.replace("$3", "$3::jsonb")
                    await conn.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", values)
        finally:
            await conn.close()

    anyio.run(go)


def _orphans(cli: Cli) -> dict[str, int]:
    return {
        table: _query(cli, f"SELECT count(*) FROM {table} WHERE job_id NOT IN (SELECT id FROM {T.job})")[0][0]
        for table in _tables(cli)
    }


def _rows_of(cli: Cli, ids: list[str]) -> dict[str, int]:
    listed = ", ".join(f"'{i}'" for i in ids)
    return {
        t: _query(cli, f"SELECT count(*) FROM {t} WHERE job_id IN ({listed})")[0][0] for t in _tables(cli)
    }


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--older-than", "soon"], "--older-than 'soon' is not an age"),
        (["--older-than", "0"], "is not an age"),
        (["--older-than", "0s"], "under 1m"),
        (["--older-than", "1e400d"], "is not an age"),
        (["--older-than", "99999999d"], "more than 100 years"),
        (["--status", "RUNNING"], "'RUNNING' is not a finished status"),
        (["--status", "PAUSED"], "'PAUSED' is not a finished status"),
        (["--status", "done"], "'done' is not a finished status"),
        (["--batch-size", "0"], "--batch-size 0 must be from 1"),
        (["--agent", "../x"], "agent id '../x' is not allowed"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(cli: Cli, args: list[str], needle: str) -> None:
    _jobs(cli, ["old"], "COMPLETED", OLD)
    _one_line_error(cli("job", "prune", *args), EXIT_USAGE, needle)
    assert _query(cli, f"SELECT id FROM {T.job}") == [("old",)]


def test_dry_run_then_prune_then_the_pruned_id_says_so(cli: Cli) -> None:
    _jobs(cli, ["old-1", "old-2"], "COMPLETED", OLD)
    _jobs(cli, ["old-dead"], "DEAD_LETTER", OLD)
    _jobs(cli, ["old-live"], "RUNNING", OLD)  # old but not finished: never pruned
    _jobs(cli, ["young"], "COMPLETED", time.time())
    for job_id in ("old-1", "old-live", "young"):
        (cli.data_dir / "sessions" / job_id).mkdir(parents=True)
        (cli.data_dir / "sessions" / job_id / "1-1.jsonl").write_text("{}\n")
    before = _rows_of(cli, ["old-1", "old-2", "old-dead"])

    dry = cli("job", "prune", "--older-than", "1d", "--status", "completed", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == ["old-1", "old-2", "would prune 2 jobs; nothing changed (--dry-run)"]
    assert _rows_of(cli, ["old-1", "old-2", "old-dead"]) == before

    done = cli("job", "prune", "--older-than", "1d", "--batch-size", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "pruned 3 jobs, 1 journal directories on this disk"
    assert sorted(r[0] for r in _query(cli, f"SELECT id FROM {T.job}")) == ["old-live", "young"]
    assert _orphans(cli) == dict.fromkeys(_tables(cli), 0)
    assert all(_rows_of(cli, ["old-live"]).values())
    assert not (cli.data_dir / "sessions" / "old-1").exists()
    assert (cli.data_dir / "sessions" / "old-live" / "1-1.jsonl").exists()
    assert (cli.data_dir / "sessions" / "young" / "1-1.jsonl").exists()

    shown = cli("job", "show", "old-2")
    _one_line_error(shown, EXIT_NOT_FOUND, "job old-2 was pruned at 20", "COMPLETED, agent a")
    again = cli("job", "create", "a", "--id", "old-2")
    _one_line_error(again, EXIT_CONFLICT, "job old-2 was pruned at")
    _one_line_error(cli("job", "show", "never-was"), EXIT_NOT_FOUND, "job never-was does not exist")


def test_a_prune_killed_mid_batch_leaves_no_orphan_and_a_second_one_finishes(cli: Cli) -> None:
    old = [f"old-{n:04}" for n in range(400)]
    live = ["live-run", "live-pending"]
    _jobs(cli, old, "COMPLETED", OLD)
    _jobs(cli, live[:1], "RUNNING", OLD)
    _jobs(cli, live[1:], "PENDING", OLD)
    live_rows = _rows_of(cli, live)
    with subprocess.Popen(
        [sys.executable, "-m", "agentlife", "job", "prune", "--older-than", "1h", "--batch-size", "1"],
        env=cli.env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            seen = [proc.stdout.readline() for _ in range(20)]  # 20 batches committed: mid-run for sure
            assert all(line.startswith("pruned 1 jobs") for line in seen), seen
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == -signal.SIGKILL  # killed, not finished on its own
    left = _query(cli, f"SELECT count(*) FROM {T.job} WHERE status = 'COMPLETED'")[0][0]
    assert 0 < left < len(old)
    assert _orphans(cli) == dict.fromkeys(_tables(cli), 0)  # the batch cut short was rolled back whole

    second = cli("job", "prune", "--older-than", "1h", "--batch-size", "100")
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines()[-1].startswith(f"pruned {left} jobs")
    assert sorted(r[0] for r in _query(cli, f"SELECT id FROM {T.job}")) == sorted(live)
    assert _rows_of(cli, live) == live_rows
    assert _orphans(cli) == dict.fromkeys(_tables(cli), 0)
    pruned = _query(cli, f"SELECT count(*) FROM {T.pruned}")[0][0]
    assert pruned == len(old)


def test_a_prune_killed_inside_a_batch_rolls_the_whole_batch_back(postgres_url: str, tmp_path: Path) -> None:
    """The kill lands inside a batch for sure: the test holds a lock its delete of one table waits for.

    By then the batch has deleted that job's rows in the tables before it; the kill must undo all of it.
    """
    import asyncpg

    url = postgres_url
    init_schema(url)
    cli = Cli(url, tmp_path / "data", agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=url))
    old = [f"old-{n:02}" for n in range(10)]
    _jobs(cli, old, "COMPLETED", OLD)
    held = "old-05"  # the sixth batch of one job
    argv = [sys.executable, "-m", "agentlife", "job", "prune", "--older-than", "1h", "--batch-size", "1"]

    async def waiting(watcher: Any, where: str) -> int:
        # Outside any transaction: pg_stat_activity is read afresh each time.
        return int(await watcher.fetchval(f"SELECT count(*) FROM pg_stat_activity WHERE {where}"))

    async def go() -> None:
        blocker, watcher = await asyncpg.connect(url), await asyncpg.connect(url)
        try:
            tx = blocker.transaction()
            await tx.start()
            await blocker.execute(f"SELECT 1 FROM {T.step_record} WHERE job_id = $1 FOR UPDATE", held)
            with subprocess.Popen(argv, env=cli.env, cwd=REPO, stdout=subprocess.DEVNULL) as proc:
                try:
                    with anyio.fail_after(60):
                        while not await waiting(watcher, "wait_event_type = 'Lock' AND query LIKE 'DELETE%'"):
                            await anyio.sleep(0.02)
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(timeout=30)
                finally:
                    if proc.poll() is None:
                        proc.kill()
            await tx.rollback()  # the server then finds the prune's connection gone and aborts its batch
            with anyio.fail_after(30):
                while await waiting(watcher, "query LIKE 'DELETE%' AND pid <> pg_backend_pid()"):
                    await anyio.sleep(0.02)
        finally:
            await blocker.close()
            await watcher.close()

    anyio.run(go)
    left = sorted(r[0] for r in _query(cli, f"SELECT id FROM {T.job}"))
    assert left == old[5:]  # five whole batches committed; the sixth rolled back
    assert all(_rows_of(cli, [held]).values())  # every table still holds the held job's rows
    assert _orphans(cli) == dict.fromkeys(_tables(cli), 0)
    assert _query(cli, f"SELECT count(*) FROM {T.pruned}")[0][0] == 5
