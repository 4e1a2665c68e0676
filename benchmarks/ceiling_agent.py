"""The agent of the fleet-ceiling run (benchmarks/bench_ceiling.py): a 10-turn tool agent.

The model (the fake Anthropic server, 0 ms) asks for ``write_note`` (a side effect) and ``read_note``
(read-only) in turn for nine turns, then answers: ten model calls, nine tool calls, ten checkpoints a job.

Importing this module in a worker also times each of its claims (``PostgresStore.claim_next`` as the worker
calls it: the pool's connection, the statement, the round trip) into ``$CEILING_CLAIMS_DIR/<pid>.txt``, one
figure in milliseconds a line, so the run can read the p99 the workers saw.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from agentlife import ToolAgent, tool
from agentlife.stores import PostgresStore

NOTES: dict[str, str] = {}
TURNS = 10


@tool(side_effects=True)
async def write_note(key: str, text: str) -> str:
    """Store a note (a side effect)."""
    NOTES[key] = text
    return f"stored {key}"


@tool(side_effects=False)
async def read_note(key: str) -> str:
    """Read a note back."""
    return NOTES.get(key, "")


class CeilingAgent(ToolAgent):
    """Nine tool calls, then an answer."""

    agent_id = "ceiling"
    model = "claude-sonnet-4-5"
    system = "Take notes, then answer."
    tools = (write_note, read_note)
    max_turns = TURNS + 1
    max_tokens = 128


def _time_claims(directory: str) -> None:
    samples: list[float] = []
    real = PostgresStore.claim_next

    async def timed(self: PostgresStore, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await real(self, *args, **kwargs)
        finally:
            samples.append((time.perf_counter() - start) * 1000)
            flush()  # each at once: a worker stopped by a signal may never reach atexit

    def flush() -> None:
        with (Path(directory) / f"{os.getpid()}.txt").open("a") as out:
            out.writelines(f"{x:.4f}\n" for x in samples)
        samples.clear()

    PostgresStore.claim_next = timed  # type: ignore[method-assign]


if os.environ.get("CEILING_CLAIMS_DIR"):
    _time_claims(os.environ["CEILING_CLAIMS_DIR"])
