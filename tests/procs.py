"""Helpers for tests that drive real ``python -m agentlife`` processes."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
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


def cli_in_process(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the command line's ``main(ARGS)`` in this process, as `run_cli` runs it in a new one.

    For tests of what a command does (its output, its exit code, its rows), not of the process: a
    ``python -m agentlife`` start costs about a third of a CPU second, this a few milliseconds. The command
    runs on its own thread, so it installs no signal handler here (off the main thread the command line
    leaves signals to the embedding program), with ``os.environ`` replaced by ``env`` and its stdout,
    stderr and unhandled log records (which a process with no logging set up prints on stderr) captured;
    its return code is the code `exit_now` would have passed to the OS (tests/e2e/test_cli_in_process.py
    holds it to a real process's). Paths in ``args`` must be absolute: this process's directory is not
    the one `run_cli` gives its processes.
    """
    from agentlife._cli import main

    box: dict[str, int] = {}

    def command() -> None:
        try:
            box["code"] = main(list(args))
        except SystemExit as exc:  # argparse's usage errors and --help leave through SystemExit
            box["code"] = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1

    out, err = io.StringIO(), io.StringIO()
    with (
        _environment(env),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        _no_log_handlers(),
    ):
        thread = threading.Thread(target=command, name="agentlife-cli", daemon=True)
        thread.start()
        thread.join(timeout)
    if thread.is_alive():
        raise subprocess.TimeoutExpired(["agentlife", *args], timeout, out.getvalue(), err.getvalue())
    return subprocess.CompletedProcess(["agentlife", *args], box["code"], out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _environment(env: Mapping[str, str] | None) -> Iterator[None]:
    saved = dict(os.environ)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _no_log_handlers() -> Iterator[None]:
    """The root logger as in a new process (no handler, WARNING): a record reaches stderr, not pytest."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers[:] = []
    root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


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
