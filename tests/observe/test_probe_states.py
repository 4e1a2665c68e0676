"""Probe answers that need a hand inside the runtime, in-process (`AgentHarness` with ``probes=True``).

The real-process observability tests are in ``tests/e2e/test_observability.py``; these two cases cannot be
set up from outside a process: every store connection taken (``/healthz`` 503) and the answers once the
runtime is TERMINATED.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentlife import AgentProcess, Done, LLMClient, ScriptedLLM, ScriptedTurn, State, StepContext, tool
from agentlife.stores import PostgresStore
from agentlife.testing import AgentHarness, DrainAt

# -- helpers --------------------------------------------------------------------------------------------


def get(client: httpx.Client, path: str) -> tuple[int, str]:
    response = client.get(path)
    return response.status_code, response.text.strip()


def families(text: str) -> dict[str, Any]:
    """``/metrics`` parsed by the reference Prometheus parser (it raises on malformed exposition)."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample(family: Any, suffix: str = "", **labels: str) -> float:
    """The value of the one sample ``{family}{suffix}`` of ``family`` whose labels include ``labels``."""
    matches = [
        s.value
        for s in family.samples
        if s.name == family.name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(matches) == 1, (family.name, suffix, labels, family.samples)
    return float(matches[0])


# -- 1. probes of a real process in every state -----------------------------------------------------------


# -- 1b. in-process: exhausted store pool, TERMINATED ------------------------------------------------------


def _blocking_get(port: int, path: str) -> tuple[int, str]:
    response = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5.0)
    return response.status_code, response.text.strip()


class PoolHog(AgentProcess):
    """Holds every connection of the runtime's PostgreSQL pool and asks the probes meanwhile."""

    agent_id = "pool-hog"

    def __init__(self) -> None:
        self.runtime: Any = None
        self.answers: dict[str, tuple[int, str]] = {}

    async def step(self, ctx: StepContext) -> Done | None:
        store = self.runtime.store
        pool = store._db._pool
        port = self.runtime.board.snapshot().probe_port
        self.answers["before"] = await anyio.to_thread.run_sync(_blocking_get, port, "/healthz")
        held = [await pool.acquire() for _ in range(pool.get_max_size())]
        try:
            assert not store.has_free_connection()
            for path in ("/healthz", "/readyz"):
                self.answers[path] = await anyio.to_thread.run_sync(_blocking_get, port, path)
        finally:
            for conn in held:
                await pool.release(conn)
        self.answers["after"] = await anyio.to_thread.run_sync(_blocking_get, port, "/healthz")
        return Done(result="ok")


@pytest.mark.anyio
async def test_healthz_is_503_while_every_store_connection_is_taken(
    tmp_path: Path, postgres_url: str
) -> None:
    store = PostgresStore(postgres_url, create_schema=True)
    await store.open()
    try:
        await store.create_job("obs-pool", PoolHog.agent_id, None)
    finally:
        await store.close()
    agent = PoolHog()

    def on_event(runtime: Any, event: str, info: dict[str, Any]) -> None:
        agent.runtime = runtime

    harness = AgentHarness(tmp_path, time_scale=0.1)
    result = await harness.run(
        agent, job_id="obs-pool", probes=True, env={"AGENTLIFE_DATABASE_URL": postgres_url}, on_event=on_event
    )
    assert result.exit_code == 0, result.log_messages()
    assert agent.answers["before"] == (200, "ok")
    assert agent.answers["/healthz"] == (503, "store pool has no free connection")
    assert agent.answers["/readyz"] == (200, "ok")
    assert agent.answers["after"] == (200, "ok")


@tool(side_effects=True)
async def record(step: int) -> int:
    return step


class Stepper(AgentProcess):
    agent_id = "stepper"

    def make_llm(self) -> LLMClient:
        return ScriptedLLM([ScriptedTurn.text("ok")], cycle=True)

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.llm.complete(
            model="claude-sonnet-4-5", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
        await ctx.call_tool(record, step=ctx.step)
        return Done() if ctx.step >= 5 else None


@pytest.mark.anyio
async def test_terminated_answers_503_and_metrics_hold_the_drain(tmp_path: Path) -> None:
    answers: dict[str, tuple[int, str]] = {}

    def on_event(runtime: Any, event: str, info: dict[str, Any]) -> None:
        if event == "transition" and info["target"] is State.TERMINATED:
            # Blocking requests from the agent's own loop thread: the probe thread answers regardless.
            port = runtime.board.snapshot().probe_port
            for path in ("/healthz", "/readyz", "/status", "/metrics"):
                answers[path] = _blocking_get(port, path)

    harness = AgentHarness(tmp_path, time_scale=0.1)
    result = await harness.run(
        Stepper(), job_id="obs-term", probes=True, drain=DrainAt.between_steps(1), on_event=on_event
    )
    assert result.exit_code == 143
    assert answers["/healthz"] == (503, "TERMINATED")
    assert answers["/readyz"] == (503, "TERMINATED")
    assert answers["/status"][0] == 200 and orjson.loads(answers["/status"][1])["state"] == "TERMINATED"
    parsed = families(answers["/metrics"][1])
    assert sample(parsed["agent_lifecycle_state"], state="TERMINATED") == 1
    assert sample(parsed["agent_drains"], "_total", reason="SIGTERM") == 1
    assert sample(parsed["agent_drain_duration_seconds"], "_count", reason="SIGTERM") == 1
    assert sample(parsed["agent_execution_seconds"], "_count") == 1
    assert sample(parsed["agent_steps_completed"], "_total") == 2
    assert sample(parsed["agent_llm_calls"], "_total", outcome="ok") == 2
