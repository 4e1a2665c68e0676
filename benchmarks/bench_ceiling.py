"""The fleet's ceiling: what one job costs PostgreSQL, and where the claims of many slots start to contend.

Run on demand (``python benchmarks/run.py --only ceiling``, or alone): never by ``nox -s bench``.

A real PostgreSQL started by the run with its durable defaults (fsync on) and ``pg_stat_statements``
loaded; the fake Anthropic server answering at once (0 ms); ``CEILING_JOBS`` jobs (default 150) of a
typical shape, `ceiling_agent.CeilingAgent`: a 10-turn ToolAgent (nine tool calls, one of two a side
effect, then an answer). The same jobs run once per fleet shape of ``CEILING_FLEETS`` (default
``1x5,2x25,2x50``: workers x ``--concurrency``), each on a fresh database, statistics reset before it.

Per job, from the statistics of the run of ``CEILING_MAIN`` (default ``1x5``: the least contended),
every statement the workers sent counted (their start-up and the idle claims of the run's last quarter
second included; the run's own polling is made by another role and left out):

- ``statements``: ``pg_stat_statements`` calls (each a statement; a transaction's BEGIN / COMMIT too).
- ``rows written``: ``pg_stat_user_tables`` inserted + updated + deleted rows.
- ``WAL bytes``: ``pg_stat_wal`` (the whole cluster: full-page images and background work included).
- ``PostgreSQL execution time``: ``pg_stat_statements`` total_exec_time. A lower bound of the server's CPU
  (it leaves out parsing, the protocol and the background processes; it does include a commit's wait
  for its WAL flush, which is not CPU, so read it as an order of magnitude).
- ``PostgreSQL CPU``: user + system time of the postmaster and every process under it (backends that
  exited included), from ``/proc``: an upper bound of what the jobs cost it (the checkpointer, WAL writer,
  autovacuum and the statistics queries of this run are in it).
- ``jobs per second per PostgreSQL core``: 1000 / the CPU figure (a floor), and 1000 / the execution-time
  figure (a ceiling); one PostgreSQL with K cores carries about K times that, while its disk keeps up with
  the WAL bytes and nothing else on it contends.

For each fleet shape, the workers' own view of their claims (``PostgresStore.claim_next`` as the worker
calls it, timed in the worker by ``ceiling_agent``: the wait for a pooled connection, the round trip and
the worker's event loop getting back to it among its running jobs are all in it), p99 against the
smallest fleet's; the claim statement's mean and max execution time on the server; PostgreSQL's CPU
per job at that fleet; and the fleet's throughput on this machine (workers and PostgreSQL share it).
Targets: reported (no pass/fail); the docs derive the ceiling from them.
"""

from __future__ import annotations

import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, child_env, emit

from _pg import PostgresServer
from agentlife.stores import PostgresStore
from agentlife.testing import FakeAnthropicServer, ScriptedTurn

#: run.py runs this script only when named (``--only ceiling``).
ON_DEMAND = True

JOBS = int(os.environ.get("CEILING_JOBS", "150"))
FLEETS = [
    tuple(int(x) for x in shape.split("x"))
    for shape in os.environ.get("CEILING_FLEETS", "1x5,2x25,2x50").split(",")
]
MAIN = os.environ.get("CEILING_MAIN", "1x5")
TIMEOUT = float(os.environ.get("CEILING_TIMEOUT", "240"))
TURNS = 10
TERMINAL = ("COMPLETED", "FAILED", "DEAD_LETTER", "CANCELLED")
CLAIM_PREFIX = "WITH claimed AS"


def script() -> dict[tuple[int, int], Any]:
    turns: dict[tuple[int, int], Any] = {}
    for step in range(TURNS - 1):
        key = f"k{step // 2}"
        if step % 2 == 0:
            turns[(step, 0)] = ScriptedTurn.tool_use("write_note", {"key": key, "text": "x" * 300})
        else:
            turns[(step, 0)] = ScriptedTurn.tool_use("read_note", {"key": key})
    turns[(TURNS - 1, 0)] = ScriptedTurn.text("done: " + "w" * 200)
    return turns


def start_server() -> PostgresServer:
    server = PostgresServer(fast=False)
    server.init()
    with (server.data_dir / "postgresql.conf").open("a") as conf:
        conf.write("shared_preload_libraries = 'pg_stat_statements'\nmax_connections = 300\n")
        conf.write("pg_stat_statements.track = 'top'\n")
    server.start()
    server.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return server


# -- PostgreSQL's CPU from /proc ---------------------------------------------------------------------------


def postgres_cpu_seconds(data_dir: Path) -> float:
    """User + system seconds of the postmaster, the processes it reaped and those running under it."""
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(proc.name), int(fields[1])
        if pid == postmaster:  # utime, stime, cutime, cstime: its own and its reaped children's
            total += sum(int(x) for x in fields[11:15])
        elif ppid == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / tick


# -- one fleet run -----------------------------------------------------------------------------------------


async def snapshot(admin: Any, db: Any, dbid: int, user: int) -> dict[str, float]:
    wal = await admin.fetchrow("SELECT wal_bytes, wal_records, wal_fpi FROM pg_stat_wal")
    stmts = await admin.fetchrow(
        "SELECT coalesce(sum(calls), 0) AS calls, coalesce(sum(rows), 0) AS rows,"
        " coalesce(sum(total_exec_time), 0) AS exec_ms, coalesce(sum(wal_bytes), 0) AS stmt_wal"
        " FROM pg_stat_statements WHERE dbid = $1 AND userid = $2",
        dbid,
        user,
    )
    tables = await db.fetchval(
        "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"
    )
    return {
        "wal_bytes": float(wal["wal_bytes"]),
        "wal_records": float(wal["wal_records"]),
        "wal_fpi": float(wal["wal_fpi"]),
        "calls": float(stmts["calls"]),
        "rows": float(stmts["rows"]),
        "exec_ms": float(stmts["exec_ms"]),
        "stmt_wal": float(stmts["stmt_wal"]),
        "rows_written": float(tables),
    }


async def run_fleet(pg: PostgresServer, monitor_url: Any, workers: int, concurrency: int) -> dict[str, Any]:
    import asyncpg  # type: ignore[import-untyped]

    url = pg.create_database(f"ceiling_{workers}x{concurrency}")
    name = url.rsplit("/", 1)[1]
    store = PostgresStore(url, listen=False)
    await store.open()
    await store.init_schema()
    for i in range(JOBS):
        await store.create_job(f"ceiling-{i:05d}", "ceiling", {"prompt": f"Take notes on item {i}."})
    await store.close()
    admin = await asyncpg.connect(monitor_url("postgres"))
    db = await asyncpg.connect(monitor_url(name))
    dbid = await admin.fetchval("SELECT oid FROM pg_database WHERE datname = $1", name)
    user = await admin.fetchval("SELECT oid FROM pg_roles WHERE rolname = $1", pg.user)
    with tempfile.TemporaryDirectory() as tmp:
        claims_dir = Path(tmp) / "claims"
        claims_dir.mkdir()
        async with FakeAnthropicServer(script()) as model:
            env = child_env(
                AGENTLIFE_DATABASE_URL=url,
                ANTHROPIC_API_KEY="sk-ceiling-0123456789",
                ANTHROPIC_BASE_URL=model.base_url,
                AGENTLIFE_HEALTH_PORT="off",
                AGENTLIFE_LOG_LEVEL="WARNING",
                CEILING_CLAIMS_DIR=str(claims_dir),
            )
            await admin.execute("SELECT pg_stat_statements_reset()")
            await anyio.sleep(1.0)  # the job table's statistics of the inserts above reach the views
            before = await snapshot(admin, db, dbid, user)
            cpu_before = postgres_cpu_seconds(pg.data_dir)
            began = time.monotonic()
            procs = []
            for w in range(workers):
                command = [sys.executable, "-m", "agentlife", "worker", "ceiling_agent:CeilingAgent"]
                command += ["--concurrency", str(concurrency), "--idle-timeout", "30"]
                procs.append(
                    subprocess.Popen(
                        command,
                        env={**env, "AGENTLIFE_DATA_DIR": str(Path(tmp) / f"worker-{w}")},
                        cwd=REPO,
                        stdout=subprocess.DEVNULL,
                        # A file, not a pipe nobody reads until the end: a chatty worker would block on it.
                        stderr=(Path(tmp) / f"worker-{w}.log").open("wb"),
                    )
                )
            finished = 0
            while time.monotonic() - began < TIMEOUT:
                await anyio.sleep(0.25)
                finished = await db.fetchval(
                    "SELECT count(*) FROM job WHERE status = ANY($1::text[])", TERMINAL
                )
                if finished >= JOBS:
                    break
            seconds = time.monotonic() - began
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for w, proc in enumerate(procs):
                proc.wait(timeout=60)
                if proc.returncode not in (0, 143, -15):
                    sys.stderr.write((Path(tmp) / f"worker-{w}.log").read_text(errors="replace")[-2000:])
            cpu = postgres_cpu_seconds(pg.data_dir) - cpu_before
            await anyio.sleep(1.0)  # the exited backends' table statistics reach the views
            after = await snapshot(admin, db, dbid, user)
            completed = await db.fetchval("SELECT count(*) FROM job WHERE status = 'COMPLETED'")
            claim = await admin.fetchrow(
                "SELECT sum(calls) AS calls, sum(total_exec_time) / sum(calls) AS mean_ms,"
                " max(max_exec_time) AS max_ms FROM pg_stat_statements"
                " WHERE dbid = $1 AND userid = $2 AND query LIKE $3",
                dbid,
                user,
                CLAIM_PREFIX + "%",
            )
            top = await admin.fetch(
                "SELECT calls, total_exec_time, rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 90) AS q"
                " FROM pg_stat_statements WHERE dbid = $1 AND userid = $2"
                " ORDER BY total_exec_time DESC LIMIT 8",
                dbid,
                user,
            )
        samples = [float(x) for f in claims_dir.glob("*.txt") for x in f.read_text().split()]
    await admin.close()
    await db.close()
    delta = {k: after[k] - before[k] for k in after}
    shape = f"{workers}x{concurrency}"
    print(
        f"{shape}: {completed}/{JOBS} jobs COMPLETED in {seconds:.1f} s; PostgreSQL CPU {cpu:.2f} s; "
        f"{len(samples)} claims timed in the workers",
        flush=True,
    )
    for row in top:
        print(
            f"   {row['calls']:>6} calls {row['total_exec_time']:>9.1f} ms {row['rows']:>6} rows  {row['q']}",
            flush=True,
        )
    return {
        "shape": shape,
        "slots": workers * concurrency,
        "seconds": seconds,
        "completed": completed,
        "cpu_s": cpu,
        "delta": delta,
        "claim_calls": float(claim["calls"] or 0),
        "claim_mean_ms": float(claim["mean_ms"] or 0),
        "claim_max_ms": float(claim["max_ms"] or 0),
        "claim_p50_ms": statistics.median(samples) if samples else 0.0,
        "claim_p99_ms": pct(samples, 0.99) if samples else 0.0,
        "claims_timed": len(samples),
    }


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def report(runs: list[dict[str, Any]]) -> None:
    main = next((r for r in runs if r["shape"] == MAIN), runs[-1])
    d, n = main["delta"], JOBS
    scale = f"{JOBS} jobs of 10 turns, {main['shape']} fleet, fsync on"
    per_job = {
        "statements per job": (d["calls"] / n, "statements"),
        "rows written per job (inserted + updated + deleted)": (d["rows_written"] / n, "rows"),
        "WAL bytes per job (cluster-wide)": (d["wal_bytes"] / n, "bytes"),
        "WAL bytes per job, statements' own": (d["stmt_wal"] / n, "bytes"),
        "PostgreSQL execution time per job (pg_stat_statements)": (d["exec_ms"] / n, "ms"),
        "PostgreSQL CPU per job (/proc, all its processes)": (main["cpu_s"] * 1000 / n, "ms"),
    }
    for metric, (value, unit) in per_job.items():
        emit("ceiling", metric, value, unit, target=f"reported ({scale})", wal_fpi=d["wal_fpi"])
    cpu_ms, exec_ms = main["cpu_s"] * 1000 / n, d["exec_ms"] / n
    emit(
        "ceiling",
        "jobs per second per PostgreSQL core, from its CPU (floor)",
        1000 / cpu_ms if cpu_ms else 0.0,
        "jobs/s",
        target="reported: 1000 / CPU ms per job",
    )
    emit(
        "ceiling",
        "jobs per second per PostgreSQL core, from execution time (ceiling)",
        1000 / exec_ms if exec_ms else 0.0,
        "jobs/s",
        target="reported: 1000 / execution ms per job",
    )
    base = runs[0]
    for run in runs:
        extra = {
            "slots": run["slots"],
            "seconds": round(run["seconds"], 2),
            "completed": run["completed"],
            "claims_timed": run["claims_timed"],
            "server_mean_ms": round(run["claim_mean_ms"], 4),
            "server_max_ms": round(run["claim_max_ms"], 3),
            "statements_per_job": round(run["delta"]["calls"] / n, 1),
            "cpu_ms_per_job": round(run["cpu_s"] * 1000 / n, 2),
        }
        emit(
            "ceiling",
            f"claim p99 in the workers, {run['shape']} ({run['slots']} slots)",
            run["claim_p99_ms"],
            "ms",
            baseline=base["claim_p99_ms"],
            target=f"reported, against {base['shape']} ({base['slots']} slots)",
            p50_ms=round(run["claim_p50_ms"], 3),
            **extra,
        )
        emit(
            "ceiling",
            f"claim statement on the server, mean (max), {run['shape']}",
            run["claim_mean_ms"],
            "ms",
            baseline=base["claim_mean_ms"],
            target=f"reported; max {run['claim_max_ms']:.1f} ms",
            **extra,
        )
        emit(
            "ceiling",
            f"PostgreSQL CPU per job (/proc), {run['shape']}",
            run["cpu_s"] * 1000 / n,
            "ms",
            baseline=base["cpu_s"] * 1000 / n,
            target=f"reported, against {base['shape']}",
            **extra,
        )
        emit(
            "ceiling",
            f"fleet throughput on this machine, {run['shape']}",
            run["completed"] / run["seconds"],
            "jobs/s",
            baseline=base["completed"] / base["seconds"],
            target="reported (workers and PostgreSQL share the machine's cores)",
            ok=run["completed"] == JOBS,
            **extra,
        )


def main() -> None:
    server = start_server()
    try:
        password = "pw-" + secrets.token_hex(8)
        server.execute(f"CREATE ROLE monitor LOGIN SUPERUSER PASSWORD '{password}'")

        def monitor_url(database: str) -> str:
            return f"postgresql://monitor:{password}@127.0.0.1:{server.port}/{database}"

        runs = [anyio.run(run_fleet, server, monitor_url, w, c) for w, c in FLEETS]
    finally:
        server.remove()
    report(runs)


if __name__ == "__main__":
    main()
