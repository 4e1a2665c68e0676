"""A fleet on one provider account, with fleet-wide rate limits and without: 429s, retries, time, tokens.

Run on demand (``nox -s fleet``, or ``python benchmarks/run.py --only fleet``): never by ``nox -s bench``.

A real PostgreSQL, a `FakeAnthropicServer` enforcing the account's limits (``FLEET_RPM`` requests and
``FLEET_INPUT_TPM`` input tokens per minute) at ``FLEET_LATENCY`` seconds of latency, and
``FLEET_WORKERS`` workers with ``--concurrency FLEET_CONCURRENCY`` running ``FLEET_JOBS`` tool-agent jobs
(two model calls each, ``FLEET_PAYLOAD_BYTES`` of payload). Run twice on fresh databases: without limits
(the baseline: every job meets the limit on its own and retries on its own clock) and with the same
limits set as ``AGENTLIFE_RATE_LIMIT_*``. Each result line is the limited run's figure with the baseline's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, child_env, emit

from _pg import running_postgres
from agentlife.stores import PostgresStore
from agentlife.testing import FakeAnthropicServer, ProviderLimits, ScriptedTurn

#: run.py runs this script only when named (``--only fleet``).
ON_DEMAND = True


def setting(name: str, default: str) -> str:
    return os.environ.get(f"FLEET_{name}", default)


JOBS = int(setting("JOBS", "300"))
WORKERS = int(setting("WORKERS", "3"))
CONCURRENCY = int(setting("CONCURRENCY", "50"))
RPM = int(setting("RPM", "600"))
INPUT_TPM = int(setting("INPUT_TPM", "200000"))
LATENCY = tuple(float(x) for x in setting("LATENCY", "0.02,0.2").split(","))
PAYLOAD_BYTES = int(setting("PAYLOAD_BYTES", "4000"))
TIMEOUT = float(setting("TIMEOUT", "1500"))


def script() -> dict[tuple[int, int], Any]:
    ask = ScriptedTurn.tool_use("look_up", {"topic": "the release"})
    return {(0, 0): ask, (1, 0): ScriptedTurn.text("The release is fine, say the notes.")}


async def run_fleet(url: str, limited: bool, work: Path) -> dict[str, float]:
    store = PostgresStore(url)
    await store.open()
    await store.init_schema()
    words = ("lorem ipsum dolor sit amet " * (PAYLOAD_BYTES // 27 + 1))[:PAYLOAD_BYTES]
    for i in range(JOBS):
        await store.create_job(
            f"fleet-{i:04d}", "fleet", {"prompt": f"Is release {i} fine? Context: {words}"}
        )
    limits = ProviderLimits(requests_per_minute=RPM, input_tokens_per_minute=INPUT_TPM)
    async with FakeAnthropicServer(script(), limits=limits, latency=LATENCY) as server:  # type: ignore[arg-type]
        env = child_env(
            AGENTLIFE_DATABASE_URL=url,
            ANTHROPIC_API_KEY="sk-fleet-0123456789",
            ANTHROPIC_BASE_URL=server.base_url,
            AGENTLIFE_HEALTH_PORT="off",
            AGENTLIFE_LOG_LEVEL="WARNING",
            PYTHONPATH=os.pathsep.join([str(REPO / "benchmarks"), str(REPO / "src")]),
        )
        if limited:
            env.update(AGENTLIFE_RATE_LIMIT_RPM=str(RPM), AGENTLIFE_RATE_LIMIT_INPUT_TPM=str(INPUT_TPM))
        began = time.monotonic()
        procs = []
        for w in range(WORKERS):
            data = work / f"{'limited' if limited else 'baseline'}-{w}"
            command = [sys.executable, "-m", "agentlife", "worker", "fleet_agent:FleetAgent"]
            command += ["--concurrency", str(CONCURRENCY), "--idle-timeout", "3"]
            procs.append(
                subprocess.Popen(
                    command,
                    env={**env, "AGENTLIFE_DATA_DIR": str(data)},
                    cwd=REPO,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        done_at = began + TIMEOUT
        statuses: dict[str, int] = {}
        while time.monotonic() < done_at:
            await anyio.sleep(1.0)
            statuses = await count_statuses(store)
            if (
                statuses.get("COMPLETED", 0) + statuses.get("FAILED", 0) + statuses.get("DEAD_LETTER", 0)
                >= JOBS
            ):
                break
        seconds = time.monotonic() - began
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
        admitted = list(server.admitted)
        rate_limited = server.rate_limited
    await store.close()
    retries = sum(
        path.read_text(errors="replace").count('"type":"RETRY"')
        + path.read_text(errors="replace").count('"type": "RETRY"')
        for path in work.glob(f"{'limited' if limited else 'baseline'}-*/sessions/*/*.jsonl")
    )
    return {
        "seconds": seconds,
        "completed": statuses.get("COMPLETED", 0),
        "rate_limited": rate_limited,
        "retries": retries,
        "peak_input_tpm": peak_per_minute(admitted),
        "sustained_input_tpm": sustained_per_minute(admitted, INPUT_TPM),
        "mean_input_tpm": sum(t for _, t, _ in admitted) / max(seconds, 1e-9) * 60.0,
    }


async def count_statuses(store: PostgresStore) -> dict[str, int]:
    jobs = await store.list_jobs(limit=JOBS + 10)
    out: dict[str, int] = {}
    for job in jobs:
        out[job.status] = out.get(job.status, 0) + 1
    return out


def peak_per_minute(admitted: list[tuple[float, int, int]]) -> float:
    """The most input tokens admitted in any 60-second window (the whole run when it is shorter)."""
    times = sorted(admitted)
    best, start, total = 0.0, 0, 0
    for end in range(len(times)):
        total += times[end][1]
        while times[end][0] - times[start][0] > 60.0:
            total -= times[start][1]
            start += 1
        best = max(best, total)
    return best


def sustained_per_minute(admitted: list[tuple[float, int, int]], bucket: int) -> float:
    """Input tokens a minute once the first minute's full bucket was spent: what the refill let through.

    A provider's bucket starts full (a minute's limit at once) and refills at the limit a minute, so the
    rate to compare with the limit is the one after the first ``bucket`` tokens, to the last admission.
    """
    times = sorted(admitted)
    spent, i = 0, 0
    while i < len(times) and spent + times[i][1] <= bucket:
        spent += times[i][1]
        i += 1
    if i >= len(times) - 1:
        return 0.0
    rest = sum(t for _, t, _ in times[i:])
    return rest / max(times[-1][0] - times[i][0], 1e-9) * 60.0


def main() -> None:
    with running_postgres(fast=True) as pg, __import__("tempfile").TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = anyio.run(run_fleet, pg.create_database("fleet_baseline"), False, work)
        lim = anyio.run(run_fleet, pg.create_database("fleet_limited"), True, work)
    scale = f"{JOBS} jobs, {WORKERS} workers x --concurrency {CONCURRENCY}, {RPM} RPM, {INPUT_TPM} ITPM"
    emit(
        "fleet",
        "jobs_completed",
        lim["completed"],
        "jobs",
        baseline=base["completed"],
        target=f"every job COMPLETED ({scale})",
        ok=lim["completed"] == JOBS,
    )
    emit(
        "fleet",
        "responses_429",
        lim["rate_limited"],
        "429s",
        baseline=float(base["rate_limited"]),
        target="a handful: those that taught the fleet",
        ok=lim["rate_limited"] <= max(5, WORKERS * 2),
        baseline_value=base["rate_limited"],
    )
    emit(
        "fleet",
        "retries_journaled",
        lim["retries"],
        "retries",
        baseline=float(base["retries"]),
        target="none spent on rate limits",
        ok=lim["retries"] == 0,
        baseline_value=base["retries"],
    )
    emit("fleet", "completion_time", lim["seconds"], "s", baseline=base["seconds"], target="reference")
    emit(
        "fleet",
        "sustained_input_tokens_per_minute",
        lim["sustained_input_tpm"],
        "tokens/min",
        baseline=float(INPUT_TPM),
        # The provider's own bucket is the judge of "over" (responses_429); this figure, cut at the first
        # minute's bucket, is within a few per cent of the truth.
        target="90 % of the limit or more (the ratio), within the measure's 5 %, after the first bucket",
        ok=0.9 * INPUT_TPM <= lim["sustained_input_tpm"] <= INPUT_TPM * 1.05,
        baseline_run=round(base["sustained_input_tpm"]),
    )
    emit(
        "fleet",
        "peak_input_tokens_in_60s",
        lim["peak_input_tpm"],
        "tokens",
        baseline=float(base["peak_input_tpm"]),
        target="reference: a full bucket (a minute's limit) and a minute of refill, as providers allow",
    )


if __name__ == "__main__":
    main()
