"""A `ToolAgent` for the worker pool's chaos test (``test_worker_chaos.py``), on the fake Anthropic server.

Each step is one model turn; the script (`SCRIPT`) asks for the side-effecting ``apply_change`` tool in
steps 0 and 1 and answers with text in step 2. The tool appends ``invocation job pid unix_time`` to
``effects`` in ``WORKER_DIR``, fsynced, so a SIGKILL cannot lose a line; its ``verify`` reads the same file,
so a resumed job never applies a change twice.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from agentlife import NOT_DONE, ToolAgent, tool

#: Model turns per job: two tool calls, then the answer.
TURNS = 3


def script(latency: float) -> dict[str, Any]:
    """The fake server's script (``STEP/CALL`` -> turn), each turn ``latency`` seconds late."""
    change = {"tool_use": {"name": "apply_change", "input": {"change": "scale"}}, "delay": latency}
    return {"0/0": change, "1/0": change, "2/0": {"text": "all changes applied", "delay": latency}}


def _effects_path() -> Path:
    return Path(os.environ["WORKER_DIR"]) / "effects"


async def _applied(invocation_id: str) -> Any:
    path = _effects_path()
    if path.exists() and any(line.split()[0] == invocation_id for line in path.read_text().splitlines()):
        return f"applied {invocation_id}"
    return NOT_DONE


@tool(verify=_applied)
async def apply_change(change: str, invocation_id: str) -> str:
    """Apply a change to the outside world, once.

    Args:
        change: what to change.
    """
    job = invocation_id.split("/")[0]
    fd = os.open(_effects_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{invocation_id} {job} {os.getpid()} {time.time()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return f"applied {change}"


class ChaosToolAgent(ToolAgent):
    """Two side effects and an answer, one model turn per step."""

    agent_id = "chaos-tool-agent"
    model = "claude-sonnet-4-5"
    system = "Apply the changes you are asked for, then report."
    tools = (apply_change,)
    max_turns = 6
    max_tokens = 256
