"""Helpers for tests that drive real ``python -m agentlife`` processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"


def agent_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """A clean environment for a child agent process on ``data_dir``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AGENTLIFE_", "ANTHROPIC_", "OPENAI_", "OTEL_"))
    }
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO / "src"), env.get("PYTHONPATH", "")]),
            "AGENTLIFE_DATA_DIR": str(data_dir),
            "AGENTLIFE_HEALTH_HOST": "127.0.0.1",
            "AGENTLIFE_HEALTH_PORT": "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


def spawn(target: str, env: Mapping[str, str], *args: str) -> subprocess.Popen[bytes]:
    """Start ``python -m agentlife run target``."""
    return subprocess.Popen(
        [sys.executable, "-m", "agentlife", "run", target, *args],
        env=dict(env),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m agentlife ARGS`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "agentlife", *args],
        env=dict(env) if env else None,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_for(path: Path, timeout: float = 20.0) -> None:
    """Wait until ``path`` exists."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout}s")
        time.sleep(0.005)


def wait_for_handler(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
    """Wait until ``proc`` catches ``sig`` (its handler is installed), read from ``/proc/PID/status``.

    A signal sent before then meets the default action, which tests of the handler must not mistake for
    the code under test: on a loaded machine the interpreter's start alone can take over a second.
    """
    deadline = time.monotonic() + timeout
    status = Path(f"/proc/{proc.pid}/status")
    while time.monotonic() < deadline and proc.poll() is None:
        caught = next((line for line in status.read_text().splitlines() if line.startswith("SigCgt:")), "")
        if caught and int(caught.split()[1], 16) & (1 << (sig - 1)):
            return
        time.sleep(0.01)
    raise TimeoutError(f"process {proc.pid} did not install a handler for signal {sig} in {timeout}s")


def terminate(
    proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 30
) -> tuple[int, float, str]:
    """Send ``sig`` and wait: (exit code, seconds from signal to exit, stdout+stderr)."""
    sent = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, time.monotonic() - sent, (out + err).decode(errors="replace")


def json_lines(text: str) -> list[dict[str, object]]:
    """The JSON log objects in a process's output (other lines skipped)."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
    return out
