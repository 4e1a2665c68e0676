"""The fake model servers as processes (``python -m agentlife.testing``); a real agent on the OpenAI one."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import orjson
import pytest

from agentlife import ScriptedTurn
from agentlife.testing import FakeOpenAIServer
from agentlife.testing._fake_cli import DEFAULT_TEXT
from procs import REPO, agent_env

CHAT = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def _start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentlife.testing", *args],
        cwd=REPO,
        env=env or agent_env(Path("/nonexistent")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)  # closes the pipes


def _chat_text(base_url: str, invocation: str | None = None) -> str:
    headers = {"x-agentlife-invocation": invocation} if invocation else {}
    with httpx.stream(
        "POST", f"{base_url}/chat/completions", json=CHAT, headers=headers, timeout=10
    ) as response:
        assert response.status_code == 200
        parts = []
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in orjson.loads(line[6:])["choices"]:
                    parts.append(choice["delta"].get("content") or "")
    return "".join(parts)


def test_fake_openai_serves_a_script_logs_requests_and_exits_0_on_sigterm(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    script = tmp_path / "turns.json"
    script.write_text('{"0/0": "step zero", "1/0": [{"http_error": 429, "retry_after": 2}, {"text": "one"}]}')
    log = tmp_path / "requests.jsonl"
    proc = _start("fake-openai", "--port", "0", "--script", str(script), "--requests-log", str(log))
    processes.append(proc)
    assert proc.stdout is not None
    base_url = proc.stdout.readline().strip()
    assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")

    assert _chat_text(base_url, "job-a/0/0") == "step zero"
    refused = httpx.post(
        f"{base_url}/chat/completions", json=CHAT, headers={"x-agentlife-invocation": "job-a/1/0"}
    )
    assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
    assert _chat_text(base_url, "job-a/1/0") == "one"

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    lines = [orjson.loads(line) for line in log.read_text().splitlines()]
    assert [line["invocation"] for line in lines] == ["job-a/0/0", "job-a/1/0", "job-a/1/0"]
    assert {line["model"] for line in lines} == {"gpt-4o-mini"}
    assert {line["path"] for line in lines} == {"/v1/chat/completions"}


def test_fake_anthropic_without_a_script_answers_every_request_and_exits_0_on_sigint(
    processes: list[subprocess.Popen[str]],
) -> None:
    proc = _start("fake-anthropic")
    processes.append(proc)
    assert proc.stdout is not None
    base_url = proc.stdout.readline().strip()
    body = {"model": "claude-sonnet-4-5", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(2):
        reply = httpx.post(f"{base_url}/v1/messages", json=body, timeout=10)
        assert reply.status_code == 200
        assert reply.json()["content"] == [{"type": "text", "text": DEFAULT_TEXT}]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(20) == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('[{"txt": 1}]', "error: turn 0: a turn has exactly one of text, tool_use"),
        ('{"zero": "hi"}', "error: script key 'zero' is not STEP/CALL"),
        ('[{"http_error": 429, "retry_after": "soon"}]', "error: turn 0: retry_after is a number of seconds"),
        ('[{"text": "a", "colour": 1}]', "error: turn 0: text turns take no colour"),
        ("not json", "is not JSON"),
    ],
)
def test_a_bad_script_is_one_line_and_exit_2(tmp_path: Path, content: str, message: str) -> None:
    script = tmp_path / "bad.json"
    script.write_text(content)
    proc = subprocess.run(
        [sys.executable, "-m", "agentlife.testing", "fake-openai", "--script", str(script)],
        cwd=REPO,
        env=agent_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr
    assert "Traceback" not in proc.stderr


# --- a real agent process on the OpenAI-compatible fake -----------------------------------------------


@pytest.mark.anyio
async def test_an_agent_runs_on_the_openai_fake_chosen_by_environment(tmp_path: Path) -> None:
    script = {(0, 0): "alpha", (1, 0): [ScriptedTurn.stall(after_chunks=1), "beta"], (2, 0): "gamma"}
    async with FakeOpenAIServer(script, api_key="sk-proj-agent-secret-0123456789") as server:
        data = tmp_path / "data"
        env = agent_env(
            data,
            AGENTLIFE_JOB_ID="job-openai",
            AGENTLIFE_LLM_PROVIDER="openai",
            AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS="0.3",
            OPENAI_BASE_URL=server.base_url,
            OPENAI_API_KEY="sk-proj-agent-secret-0123456789",
            TEST_STEPS="3",
        )
        command = [sys.executable, "-m", "agentlife", "run", "agents.calls_agents:LLMStepsAgent"]
        with anyio.fail_after(90):
            proc = await anyio.run_process(command, env=env, cwd=REPO, check=False)
        output = (proc.stdout + proc.stderr).decode()
        assert proc.returncode == 0, output
        # Step 1's first request stalled, was abandoned and sent again: the fake counted it twice.
        assert server.requests_by_invocation() == {
            "job-openai/0/0": 1,
            "job-openai/1/0": 2,
            "job-openai/2/0": 1,
        }
        await server.wait_for_disconnects(1)
        assert server.requests[0].body["messages"] == [{"role": "user", "content": "step 0"}]
    conn = sqlite3.connect(data / "agentlife.db")
    try:
        status, result = conn.execute("SELECT status, result FROM job WHERE id = 'job-openai'").fetchone()
    finally:
        conn.close()
    assert status == "COMPLETED"
    assert orjson.loads(result) == {"replies": ["alpha", "beta", "gamma"]}
    assert "sk-proj-agent-secret-0123456789" not in output


@pytest.mark.anyio
async def test_an_unknown_provider_is_refused_at_boot(tmp_path: Path) -> None:
    env = agent_env(tmp_path / "data", AGENTLIFE_JOB_ID="job-x", AGENTLIFE_LLM_PROVIDER="gemini")
    command = [sys.executable, "-m", "agentlife", "run", "agents.calls_agents:LLMStepsAgent"]
    with anyio.fail_after(60):
        proc = await anyio.run_process(command, env=env, cwd=REPO, check=False)
    output = (proc.stdout + proc.stderr).decode()
    assert proc.returncode == 2, output
    assert "AGENTLIFE_LLM_PROVIDER='gemini' is not a provider: use anthropic or openai" in output
    assert "Traceback" not in output
