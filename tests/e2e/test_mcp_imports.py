"""Tools from MCP servers: real servers on the official SDK, started as real processes (stdio and HTTP).

The agent runs in this process (`AgentHarness`); the servers are ``tests/mcp_test_server.py``. Tests that only
read from a server, or write under their own job id, share one Streamable HTTP server process (``shared``);
those about a server's own process (its start, crash, restart, variants) start their own over stdio.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.anyio

SERVER = str(Path(__file__).resolve().parent.parent / "mcp_test_server.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Shared:
    url: str
    state: Path


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    """One Streamable HTTP server process for the module's tests that do not need a server of their own."""
    port = free_port()
    state = tmp_path_factory.mktemp("shared-mcp")
    proc = subprocess.Popen([sys.executable, SERVER, str(state), "--http", str(port)])
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield Shared(f"http://127.0.0.1:{port}/mcp", state)
    finally:
        proc.kill()
        proc.wait()


def test_import_agentlife_does_not_import_mcp() -> None:
    code = "import sys, agentlife; agentlife.MCPServer; assert 'mcp' not in sys.modules, 'mcp imported'"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent.parent / "src")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
