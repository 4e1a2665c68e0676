"""The triage example as users run it: ``python -m agentlife run`` against each fake model server process.

The same agent, unchanged, against ``python -m agentlife.testing fake-anthropic`` and ``fake-openai``: an
uninterrupted run, SIGTERM during the side-effecting tool, and seeded SIGKILLs at random moments. Each job
must end with its label applied exactly once, a conversation byte-identical to the uninterrupted run's, and
at most one model request re-sent per kill (counted by the server, from the ``x-agentlife-invocation``
header).
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from procs import REPO, agent_env

EXAMPLES = REPO / "examples"
SCRIPT = EXAMPLES / "issue_triage_script.json"
PAYLOAD = '{"prompt": "Triage issue #7."}'
RESULT = {"number": 7, "label": "bug", "priority": "high", "summary": "Empty config file crashes start-up."}
#: Seeded SIGKILLs per provider and shard (32 in all in the exhaustive run; the suite's one shard has 4, a
#: job's worth). Shards are separate tests, so a parallel run spreads them.
EXHAUSTIVE = os.environ.get("AGENTLIFE_TESTS_EXHAUSTIVE") == "1"
KILLS = dict.fromkeys(("anthropic", "openai"), 8 if EXHAUSTIVE else 4)
#: One shard in the suite (the SIGTERM test runs on both servers), the rest in the exhaustive run.
KILL_SHARDS = [
    ("anthropic", 0),
    pytest.param("anthropic", 1, marks=pytest.mark.exhaustive),
    pytest.param("openai", 0, marks=pytest.mark.exhaustive),
    pytest.param("openai", 1, marks=pytest.mark.exhaustive),
]
#: How long after the step loop starts a kill may land: the whole job, model calls and tools included
#: (neither default client imports an SDK, so both jobs take about as long).
KILL_WINDOW = {"anthropic": 0.4, "openai": 0.4}


@dataclass
class FakeServer:
    provider: str
    base_url: str
    requests_log: Path

    def env(self) -> dict[str, str]:
        if self.provider == "anthropic":
            return {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": self.base_url}
        return {
            "AGENTLIFE_LLM_PROVIDER": "openai",
            "OPENAI_BASE_URL": self.base_url,
            "OPENAI_API_KEY": "test-key",
        }

    def requests(self, job_id: str) -> Counter[str]:
        lines = self.requests_log.read_text().splitlines() if self.requests_log.exists() else []
        invocations = (orjson.loads(line).get("invocation") or "" for line in lines)
        return Counter(i for i in invocations if i.startswith(f"{job_id}/"))


@pytest.fixture
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FakeServer]:
    provider = request.param
    log = tmp_path / f"{provider}-requests.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentlife.testing",
            f"fake-{provider}",
            "--port",
            "0",
            "--script",
            str(SCRIPT),
            "--requests-log",
            str(log),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert proc.stdout is not None
    base_url = proc.stdout.readline().decode().strip()
    assert base_url.startswith("http://127.0.0.1:"), proc.stderr.read().decode() if proc.stderr else ""
    try:
        yield FakeServer(provider, base_url, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
        assert proc.returncode == 0


class Triage:
    """Runs attempts of one job of the example in ``data``, as a control plane would."""

    def __init__(self, tmp_path: Path, server: FakeServer, job_id: str, **extra: str) -> None:
        self.data = tmp_path / "data"
        self.outbox = tmp_path / "outbox"
        self.server = server
        self.job_id = job_id
        self.extra = extra
        self.attempt = 0

    def spawn(self) -> subprocess.Popen[bytes]:
        self.attempt += 1
        env = agent_env(
            self.data,
            AGENTLIFE_JOB_ID=self.job_id,
            AGENTLIFE_ATTEMPT=str(self.attempt),
            AGENTLIFE_HEALTH_PORT="off",
            TRIAGE_OUTBOX=str(self.outbox),
            **self.server.env(),
            **self.extra,
        )
        env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLES), env["PYTHONPATH"]])
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentlife",
                "run",
                "issue_triage_agent:IssueTriage",
                "--payload",
                PAYLOAD,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )

    def run_to_end(self) -> None:
        proc = self.spawn()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out + err).decode()[-3000:]

    def labels(self) -> list[dict[str, object]]:
        path = self.outbox / "labels.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [orjson.loads(line) for line in lines if line.startswith("{") and line.endswith("}")]

    def job_labels(self) -> list[dict[str, object]]:
        return [e for e in self.labels() if str(e["invocation_id"]).startswith(f"{self.job_id}/")]

    def row(self) -> tuple[str, object, list[bytes]]:
        conn = sqlite3.connect(self.data / "agentlife.db")
        try:
            status, result = conn.execute(
                "SELECT status, result FROM job WHERE id = ?", (self.job_id,)
            ).fetchone()
            rows = conn.execute(
                "SELECT message FROM conversation WHERE job_id = ? ORDER BY seq", (self.job_id,)
            ).fetchall()
        finally:
            conn.close()
        return status, orjson.loads(result) if result else None, [bytes(r[0]) for r in rows]


def uninterrupted(tmp_path: Path, server: FakeServer) -> list[bytes]:
    baseline = Triage(tmp_path, server, "base")
    baseline.run_to_end()
    status, result, conversation = baseline.row()
    assert (status, result) == ("COMPLETED", RESULT)
    assert len(conversation) == 8  # the prompt, then 4 model turns, 3 of them followed by tool results
    assert len(baseline.job_labels()) == 1
    assert set(server.requests("base").values()) == {1}  # one request per model turn
    return conversation


@pytest.mark.parametrize("server", ["anthropic", "openai"], indirect=True)
def test_sigterm_during_the_label_call_resumes_identically(tmp_path: Path, server: FakeServer) -> None:
    _sigterm_during_the_label_call(tmp_path, server, uninterrupted(tmp_path, server))


@pytest.mark.slow(12)
@pytest.mark.parametrize(("server", "shard"), KILL_SHARDS, indirect=["server"])
def test_seeded_sigkills_end_identically(tmp_path: Path, server: FakeServer, shard: int) -> None:
    _seeded_sigkills(tmp_path, server, uninterrupted(tmp_path, server), shard)


def _sigterm_during_the_label_call(tmp_path: Path, server: FakeServer, expected: list[bytes]) -> None:
    job = Triage(tmp_path, server, "drained", TRIAGE_TOOL_DELAY="0.3")
    proc = job.spawn()
    deadline = time.monotonic() + 30
    while not _label_started(job) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _label_started(job), "the label call never started"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, (out + err).decode()[-3000:]
    job.extra = {}
    job.run_to_end()
    assert job.row() == ("COMPLETED", RESULT, expected)
    assert len(job.job_labels()) == 1
    assert sum(n - 1 for n in server.requests("drained").values()) == 0  # nothing re-sent after a drain


def _label_started(job: Triage) -> bool:
    for path in (job.data / "sessions" / job.job_id).glob("*.jsonl"):
        with path.open("rb") as f:
            if any(b'"TOOL_STARTED"' in line and b'"label_issue"' in line for line in f):
                return True
    return False


def _seeded_sigkills(tmp_path: Path, server: FakeServer, expected: list[bytes], shard: int) -> None:
    rng = random.Random(f"triage-{server.provider}-{shard}")
    kills, job_number = 0, 0
    while kills < KILLS[server.provider]:
        job_number += 1
        job = Triage(tmp_path, server, f"killed-{job_number}", TRIAGE_TOOL_DELAY="0.05")
        job_kills = 0
        for _ in range(4):  # up to four kills per job, then it runs to the end
            proc = job.spawn()
            if not _kill_at_a_random_moment(proc, rng, KILL_WINDOW[server.provider]):
                break
            job_kills += 1
        job.run_to_end()
        kills += job_kills
        assert job.row() == ("COMPLETED", RESULT, expected), f"job {job.job_id} after {job_kills} kills"
        assert len(job.job_labels()) == 1, job.labels()
        resent = sum(n - 1 for n in server.requests(job.job_id).values())
        assert resent <= job_kills, (job.job_id, job_kills, server.requests(job.job_id))


def _kill_at_a_random_moment(proc: subprocess.Popen[bytes], rng: random.Random, window: float) -> bool:
    """SIGKILL at a random moment of the step loop; False if the job ended first."""
    assert proc.stdout is not None
    for raw in proc.stdout:
        if b"READY -> EXECUTING" in raw or b'"exit_code"' in raw:
            break
    time.sleep(rng.uniform(0.0, window))
    alive = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    return alive and proc.returncode == -signal.SIGKILL
