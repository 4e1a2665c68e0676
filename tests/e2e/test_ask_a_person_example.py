"""The ask-a-person example runs as its docstring says: park, `job send`, resume, deploy once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from procs import REPO, agent_env, cli_in_process

TARGET = "ask_a_person_agent:DeployGate"
PAYLOAD = '{"service": "billing", "version": "2.4.1"}'


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentlife", "run", TARGET, "--job-id", "deploy-7", *args],
        cwd=REPO / "examples",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _lines(data: Path, name: str) -> list[dict[str, object]]:
    path = data / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _show(env: dict[str, str]) -> str:
    shown = cli_in_process("job", "show", "deploy-7", env=env)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


@pytest.mark.parametrize(
    ("answer", "result", "deployed"),
    [
        (
            '{"approve": true, "by": "ana"}',
            {"approved_by": "ana", "outcome": "deployed", "version": "2.4.1"},
            1,
        ),
        ('{"approve": false, "reason": "freeze"}', {"outcome": "declined", "reason": "freeze"}, 0),
    ],
)
def test_the_question_parks_the_job_and_the_answer_resumes_it_once(
    tmp_path: Path, answer: str, result: dict[str, object], deployed: int
) -> None:
    data = tmp_path / "data"
    env = agent_env(data)
    first = _run(env, "--payload", PAYLOAD)
    assert first.returncode == 0, first.stderr[-2000:]
    shown = _show(env)
    assert "status      WAITING" in shown and "waits for   event 'answer' until" in shown, shown
    again = _run(env)  # started again before anyone answered: it parks again, asking nothing new
    assert again.returncode == 0, again.stderr[-2000:]
    sent = cli_in_process("job", "send", "deploy-7", "answer", "--payload", answer, env=env)
    assert sent.returncode == 0, sent.stderr
    resumed = _run(env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "status      COMPLETED" in _show(env)
    assert f"result      {json.dumps(result, sort_keys=True)}" in _show(env)
    assert [q["key"] for q in _lines(data, "questions.jsonl")] == ["deploy-7/0/0"]  # asked once
    assert len(_lines(data, "deployments.jsonl")) == deployed


def test_no_answer_within_the_time_ends_the_job_failed_with_the_reason(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = agent_env(data, ANSWER_TIMEOUT_SECONDS="0.2")  # under park_after: it waits in the process
    done = _run(env, "--payload", PAYLOAD)
    assert done.returncode == 0, done.stderr[-2000:]
    shown = _show(env)
    assert "status      FAILED" in shown and "no answer within the time" in shown, shown
    assert _lines(data, "deployments.jsonl") == []


def test_an_approval_sent_after_the_deadline_never_deploys(tmp_path: Path) -> None:
    # The job parks on a 1 s wait; the approval comes after the deadline, and the job resumes later still:
    # "no answer within the time" came first, so it fails and deploys nothing.
    data = tmp_path / "data"
    env = agent_env(data, ANSWER_TIMEOUT_SECONDS="1", AGENTLIFE_PARK_AFTER_SECONDS="0.3")
    first = _run(env, "--payload", PAYLOAD)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "status      WAITING" in _show(env)
    time.sleep(1.2)
    sent = cli_in_process(
        "job", "send", "deploy-7", "answer", "--payload", '{"approve": true, "by": "ana"}', env=env
    )
    assert sent.returncode == 0, sent.stderr
    late = _run(env)
    assert late.returncode == 0, late.stderr[-2000:]
    shown = _show(env)
    assert "status      FAILED" in shown and "no answer within the time" in shown, shown
    assert _lines(data, "deployments.jsonl") == []
