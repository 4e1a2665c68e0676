"""A rewound job's next attempt SIGKILLed mid-step: the attempt after it replays what the killed one
recorded after the rewind, never what the job recorded before it (a real process, a real SIGKILL)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from agentlife import Client
from agentlife.testing import AgentHarness
from agents.rewind_agent import RewindAgent
from procs import agent_env, spawn, wait_for

pytestmark = pytest.mark.anyio

JOB = "job-r"


async def test_sigkill_of_the_rewound_attempt_mid_step_never_replays_the_old_future(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("REWIND_DIR", str(data))
    harness = AgentHarness(data)
    monkeypatch.setenv("REWIND_LABEL", "v1")
    monkeypatch.setenv("REWIND_FAIL_AT", "8")
    first = await harness.run(RewindAgent(), job_id=JOB, attempt=1)
    assert first.job is not None and first.job.status == "FAILED"
    monkeypatch.delenv("REWIND_FAIL_AT")
    async with await Client.connect(harness.database_url) as client:
        rewound = await client.rewind(JOB, 4, actor="alice@ops", reason="prompt fixed")
    assert rewound.attempt == 2

    # Attempt 2 (deploy v2) runs step 5, then step 6 makes its effect and hangs there: SIGKILL.
    env = agent_env(
        data,
        AGENTLIFE_JOB_ID=JOB,
        AGENTLIFE_ATTEMPT="2",
        AGENTLIFE_DATABASE_URL=harness.database_url,
        REWIND_DIR=str(data),
        REWIND_LABEL="v2",
        REWIND_HANG_AT="6",
    )
    proc = spawn("agents.rewind_agent:RewindAgent", env)
    try:
        wait_for(data / "hanging", timeout=60)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    # Attempt 3 (deploy v3) on the same pod: its journal holds step 6 of v1 and of v2.
    monkeypatch.setenv("REWIND_LABEL", "v3")
    last = await harness.run(RewindAgent(), job_id=JOB, attempt=3)
    assert last.exit_code == 0 and last.job is not None and last.job.status == "COMPLETED"
    results = last.job.result["results"]
    assert results[:5] == [f"v1:{n}" for n in range(5)]
    assert results[5:7] == ["v2:5", "v2:6"]  # step 6 replayed from the killed attempt, not from v1
    assert results[7:] == ["v3:7", "v3:8", "v3:9"]
    effects = (data / "effects").read_text().splitlines()
    assert effects.count(f"{JOB}/6/0 v2") == 1 and f"{JOB}/6/0 v3" not in effects
    assert not any(f"{JOB}/{n}/0 {label}" in effects for n in range(5) for label in ("v2", "v3"))
