"""A worker reads its running limits at boot: bad ones stop it with one line before it claims anything."""

from __future__ import annotations

import pytest

from agentlife import AgentProcess, ConfigError, Done, StepContext
from agentlife._runtime._worker import Worker, WorkerOptions
from agentlife.stores import ClaimLimits


class Idle(AgentProcess):
    agent_id = "idle-agent"

    async def step(self, ctx: StepContext) -> Done | None:
        return Done(None)


def _worker(**env: str) -> Worker:
    return Worker(Idle, env=env, options=WorkerOptions(idle_timeout=1.0))


def test_the_worker_claims_with_the_limits_of_its_environment() -> None:
    worker = _worker(AGENTLIFE_CONCURRENCY_KEY_LIMIT="3", AGENTLIFE_AGENT_RUNNING_LIMIT="12")
    assert worker.claim_limits == ClaimLimits(key_default=3, agent=12)
    assert not _worker().claim_limits.active


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("AGENTLIFE_CONCURRENCY_KEY_LIMIT", "0"),
        ("AGENTLIFE_AGENT_RUNNING_LIMIT", "-5"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMITS", '{"tenant": "two"}'),
    ],
)
def test_a_bad_limit_stops_the_worker_at_boot(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name) as caught:
        _worker(**{name: value})
    assert "\n" not in str(caught.value)
