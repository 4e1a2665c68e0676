"""An agent module that receives SIGTERM while it is still being imported (a pod stopped during start-up)."""

from __future__ import annotations

import os
import signal

from agentlife import AgentProcess, Done, StepContext

os.kill(os.getpid(), signal.SIGTERM)  # delivered while `python -m agentlife run` imports this module


class EarlySignalAgent(AgentProcess):
    agent_id = "early-signal"

    async def step(self, ctx: StepContext) -> Done | None:
        raise AssertionError("a process signalled during imports must never start a step")
