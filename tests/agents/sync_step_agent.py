"""An agent whose ``step`` is a plain ``def``."""

from __future__ import annotations

from agentlife import AgentProcess, Done, StepContext


class SyncStepAgent(AgentProcess):
    agent_id = "sync-step"

    def step(self, ctx: StepContext) -> Done | None:  # type: ignore[override]
        return Done()


if __name__ == "__main__":
    SyncStepAgent.main()
