"""Retries of tools: a side-effecting tool without ``verify`` runs once unless told, and
``retries`` must be a whole number.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentlife import AgentProcess, Done, StepContext, tool
from agentlife.testing import AgentHarness

# -- retries of side-effecting tools --------------------------------------------------------------------


def _flaky_agent(options: dict[str, Any], fail_times: int) -> tuple[AgentProcess, list[int]]:
    runs: list[int] = []

    @tool(**options)
    async def send(n: int) -> str:
        runs.append(n)
        if len(runs) <= fail_times:
            raise ConnectionError("connection reset by peer")
        return "sent"

    class Flaky(AgentProcess):
        agent_id = "flaky"

        async def step(self, ctx: StepContext) -> Done | None:
            await ctx.call_tool(send, n=1)
            return Done(result={"runs": len(runs)})

    return Flaky(), runs


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("options", "fail_times", "expected_runs", "exit_code"),
    [
        ({"side_effects": True}, 100, 1, 1),  # no verify: never retried in-process
        ({"side_effects": True, "retries": 2}, 100, 3, 1),
        ({"side_effects": True, "retries": 2}, 1, 2, 0),
        ({"side_effects": False}, 2, 3, 0),  # read-only: retried within the budgets
        ({"side_effects": False, "retries": 0}, 100, 1, 1),
    ],
)
async def test_side_effecting_tools_without_verify_run_once_unless_told(
    tmp_path: Path, options: dict[str, Any], fail_times: int, expected_runs: int, exit_code: int
) -> None:
    agent, runs = _flaky_agent(options, fail_times)
    result = await AgentHarness(tmp_path).run(agent)
    assert result.exit_code == exit_code
    assert len(runs) == expected_runs


def test_tool_retries_must_be_a_whole_number() -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="retries"):
            tool(retries=bad)(lambda: None)  # type: ignore[arg-type]
