"""The agent of the fleet run (benchmarks/bench_fleet.py): a tool agent, one tool call, then an answer."""

from __future__ import annotations

from agentlife import ToolAgent, tool


@tool
def look_up(topic: str) -> str:
    """What the notes say about a topic."""
    return f"notes on {topic}: all good"


class FleetAgent(ToolAgent):
    """Asks the model, which calls ``look_up`` once and then answers: two model calls per job."""

    agent_id = "fleet"
    model = "claude-sonnet-4-5"
    system = "Answer from the notes."
    tools = (look_up,)
    max_turns = 4
    max_tokens = 128
