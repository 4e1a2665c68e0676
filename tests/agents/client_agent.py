"""The agent of the client's real-process tests (``tests/e2e/test_client_processes.py``), driven by payload.

``{"echo": X}`` completes with ``{"echo": X, "attempt": N}``; ``{"fail": "why"}`` ends FAILED with that
reason; ``{"hold": true}`` first touches ``held-{job}-{attempt}`` in ``CLIENT_DIR`` and waits for the file
``go-{job}`` there (so a test can kill the worker, or cancel the job, while it runs).
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio

from agentlife import AgentProcess, Done, StepContext


class ClientAgent(AgentProcess):
    """One step: hold if asked, then complete with what it was given, or fail."""

    agent_id = "client-agent"

    async def step(self, ctx: StepContext) -> Done | None:
        payload = ctx.job.payload if isinstance(ctx.job.payload, dict) else {}
        if payload.get("hold"):
            folder = Path(os.environ["CLIENT_DIR"])
            (folder / f"held-{ctx.job.id}-{ctx.job.attempt}").touch()
            while not (folder / f"go-{ctx.job.id}").exists():
                await anyio.sleep(0.01)
        if payload.get("fail"):
            return Done(status="FAILED", reason=str(payload["fail"]))
        return Done(result={"echo": payload.get("echo"), "attempt": ctx.job.attempt})
