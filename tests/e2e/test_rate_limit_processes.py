"""Fleet-wide rate limits across real processes: a SIGKILLed holder's slot comes back, SIGTERM drains.

One process waits for capacity (the bucket is paused in the store): ``/status`` shows it waiting, and
SIGTERM drains it at once with exit 143, not after the pause. Another holds the one in-flight slot on a
call the fake server never answers and is SIGKILLed: the slot stays taken until its lease ends, then
comes back, and the next process's call goes through.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import anyio
import orjson
import pytest

from agentlife import ScriptedTurn
from agentlife.stores import SQLiteStore
from agentlife.testing import FakeAnthropicServer
from procs import agent_env, spawn, wait_for, wait_for_handler

pytestmark = pytest.mark.anyio

AGENT = "agents.ratelimit_agent:OneCallAgent"
CAPS = (600, None, None)


def env_for(tmp_path: Path, server: FakeAnthropicServer, job_id: str, **extra: str) -> dict[str, str]:
    return agent_env(
        tmp_path / "data",
        AGENTLIFE_JOB_ID=job_id,
        ANTHROPIC_API_KEY="sk-test-ratelimit-0123456789",
        ANTHROPIC_BASE_URL=server.base_url,
        TEST_MARKER_DIR=str(tmp_path),
        AGENTLIFE_RATE_LIMIT_RPM="600",
        **extra,
    )


def probe_port(proc: subprocess.Popen[bytes], lines: list[bytes], timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(lines):
            if line.startswith(b"{"):
                entry = orjson.loads(line)
                if entry.get("event") == "probe_listening":
                    return int(entry["port"])
        assert proc.poll() is None, b"".join(lines).decode(errors="replace")
        time.sleep(0.01)
    raise TimeoutError("no probe_listening line")


async def test_sigterm_while_waiting_for_capacity_drains_at_once_and_status_shows_the_wait(
    tmp_path: Path,
) -> None:
    (tmp_path / "data").mkdir()
    store = SQLiteStore(tmp_path / "data" / "agentlife.db")
    await store.open()
    await store.pause_rate_bucket("anthropic", CAPS, time.time() + 120)  # a provider said: two minutes
    await store.close()
    async with FakeAnthropicServer(default_turn="never sent") as server:
        env = env_for(tmp_path, server, "waits-1", AGENTLIFE_PARK_AFTER_SECONDS="600")
        proc = spawn(AGENT, env)
        lines: list[bytes] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, b"")), daemon=True)  # type: ignore[union-attr]
        reader.start()
        port = await anyio.to_thread.run_sync(probe_port, proc, lines)
        await anyio.to_thread.run_sync(wait_for, tmp_path / "calling")
        status: dict[str, object] = {}
        with anyio.fail_after(20):
            while not status.get("rate_limits", {}).get("anthropic", {}).get("waiting"):  # type: ignore[union-attr]
                await anyio.sleep(0.05)
                body = await anyio.to_thread.run_sync(
                    lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5).read()
                )
                status = orjson.loads(body)
        await anyio.to_thread.run_sync(wait_for_handler, proc)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=60))
        seconds = time.monotonic() - sent
        reader.join(5)
        assert len(server.requests) == 0  # it never called past the fleet's pause
    assert proc.stdout is not None and proc.stderr is not None
    output = b"".join(lines).decode(errors="replace") + proc.stderr.read().decode(errors="replace")
    proc.stdout.close()
    proc.stderr.close()
    assert code == 143, output
    assert status["jobs"] == [  # type: ignore[comparison-overlap]
        {**status["jobs"][0], "job_id": "waits-1", "waiting": "rate limit anthropic"}  # type: ignore[index]
    ]
    assert seconds < 20  # the pause had two minutes left: the drain did not wait for it


async def test_a_sigkilled_holder_gives_its_in_flight_slot_back_when_its_lease_ends(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    async with FakeAnthropicServer([ScriptedTurn.never_answer(), ScriptedTurn.text("through")]) as server:
        # The lease outlives the longest call: 1.1 x (connect + total) = 1.1 x (1 + 2) s here.
        timeouts = {"AGENTLIFE_LLM_CONNECT_TIMEOUT_SECONDS": "1", "AGENTLIFE_LLM_TOTAL_TIMEOUT_SECONDS": "2"}
        extra = {
            "AGENTLIFE_RATE_LIMIT_IN_FLIGHT": "1",
            "AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS": "2",
            **timeouts,
        }
        holder = spawn(AGENT, env_for(tmp_path, server, "holds-1", **extra))
        with anyio.fail_after(30):
            await server.wait_for_requests(1, timeout=30)
        store = SQLiteStore(tmp_path / "data" / "agentlife.db")
        await store.open()
        try:
            assert (await store.rate_bucket_levels("anthropic", CAPS) or ((), 0, 0))[2] == 1
            killed_at = time.monotonic()
            holder.send_signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(lambda: holder.communicate(timeout=30))
            assert (await store.rate_bucket_levels("anthropic", CAPS) or ((), 0, 0))[
                2
            ] == 1  # nobody gave it back
            with anyio.fail_after(30):
                while (await store.rate_bucket_levels("anthropic", CAPS) or ((), 0, 0))[2] != 0:
                    await anyio.sleep(0.1)
            assert time.monotonic() - killed_at < 3.3 + 10  # the lease, with a loaded machine's margin
        finally:
            await store.close()
        successor = spawn(AGENT, env_for(tmp_path, server, "next-1", **extra))
        out, err = await anyio.to_thread.run_sync(lambda: successor.communicate(timeout=60))
    assert successor.returncode == 0, (out + err).decode(errors="replace")
    assert len(server.requests) == 2


def test_a_bad_limit_stops_the_process_at_boot_with_one_line_and_exit_2(tmp_path: Path) -> None:
    """A blank value (a Helm value rendered empty) is a bad limit, not "no limit": it reaches the process."""
    env = agent_env(tmp_path / "data", AGENTLIFE_JOB_ID="bad-1", AGENTLIFE_RATE_LIMIT_RPM="")
    proc = spawn(AGENT, env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.decode().strip() == (
        "agentlife: error: AGENTLIFE_RATE_LIMIT_RPM is set but blank (a value rendered empty?): give it a "
        "value, or leave it unset for no limit"
    )
