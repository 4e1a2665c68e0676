"""An agent that fills the disk its data dir is on (a small tmpfs in the tests), then waits or goes on."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import anyio

from agentlife import AgentProcess, Done, StepContext


def _fill(directory: Path) -> None:
    with (directory / "filler").open("ab", buffering=0) as f:
        for size in (65536, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)


class FullDiskAgent(AgentProcess):
    """Step 0 fills the disk; ``FULL_WAIT=1`` then waits for SIGTERM, else the step ends (checkpoint)."""

    agent_id = "full-disk"

    async def step(self, ctx: StepContext) -> Done | None:
        ctx.state["big"] = "x" * 200_000  # a checkpoint that needs new pages
        _fill(Path(os.environ["AGENTLIFE_DATA_DIR"]))
        Path(os.environ["FULL_MARKER"]).touch()
        if os.environ.get("FULL_WAIT") == "1":
            await anyio.sleep(3600)
        return Done(result="unreachable") if ctx.step > 0 else None
