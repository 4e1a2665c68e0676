"""A step's model call under fleet-wide rate limits: waiting for capacity is a wait, never a retry.

A 429 under a configured limit pauses the bucket and the call waits its turn: no RETRY is journaled, no
retry allowance is spent. A wait gives way to a drain at once and, longer than ``park_after_seconds``,
parks the job like a durable sleep (the job's row says it waits for a rate limit).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from agentlife import ScriptedLLM, ScriptedTurn
from agentlife._exceptions import WaitParked
from agentlife._llm._ratelimiter import RateLimiter
from agentlife._ratelimit import RateLimit, RateLimits
from agentlife.stores import SQLiteStore
from stepctx import journal_events, step_contexts

pytestmark = pytest.mark.anyio

LIMITS = RateLimits(RateLimit("anthropic", requests_per_minute=600))
CAPS = (600, None, None)


async def limiter_on(tmp_path: Path) -> tuple[RateLimiter, SQLiteStore]:
    store = SQLiteStore(tmp_path / "agentlife.db")
    await store.open()
    return RateLimiter(store, LIMITS, slot_lease_seconds=3.0, store_down_seconds=0.3), store


async def call(ctx: Any) -> Any:
    return await ctx.llm.complete(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=10)


@pytest.mark.parametrize("limited", [False, True])
async def test_a_429_under_a_limit_is_waited_out_not_retried(tmp_path: Path, limited: bool) -> None:
    """Without a limit the 429 is a journaled retry (the old way); with one, a wait that spends nothing."""
    llm = ScriptedLLM([ScriptedTurn.http_error(429, retry_after=0.05), ScriptedTurn.text("done")])
    async with step_contexts(tmp_path) as make:
        ctx, journal = await make(llm)
        rate, store = await limiter_on(tmp_path)
        if limited:
            ctx._env.limiter = rate
        reply = await call(ctx)
        events = [e["type"] for e in await journal_events(journal)]
        await store.close()
    assert reply.text == "done" and len(llm.requests) == 2
    assert ("RETRY" in events) is not limited
    if limited:
        assert rate.stats["anthropic"].rate_limited == 1 and rate.stats["anthropic"].waits == 1


async def test_a_drain_while_waiting_for_capacity_ends_the_step_at_once(tmp_path: Path) -> None:
    llm = ScriptedLLM([ScriptedTurn.text("never sent")])
    async with step_contexts(tmp_path) as make:
        ctx, _ = await make(llm)
        rate, store = await limiter_on(tmp_path)
        ctx._env.limiter = rate
        await store.pause_rate_bucket("anthropic", CAPS, time.time() + 20)
        ctx._env.host.draining = True
        with pytest.raises(WaitParked) as parked:
            await call(ctx)
        await store.close()
    # Drained, not parked for the 20 s: the next attempt, wherever it runs, makes the call afresh.
    assert parked.value.drained and parked.value.waiting_for["kind"] == "rate_limit"
    assert llm.requests == []


async def test_a_wait_longer_than_park_after_parks_the_job_until_capacity_is_expected(tmp_path: Path) -> None:
    llm = ScriptedLLM([ScriptedTurn.text("later")])
    async with step_contexts(tmp_path) as make:  # time scaled by 0.01: park_after is 0.3 s
        ctx, _ = await make(llm)
        rate, store = await limiter_on(tmp_path)
        ctx._env.limiter = rate
        await store.pause_rate_bucket("anthropic", CAPS, time.time() + 20)
        with pytest.raises(WaitParked) as parked:
            await call(ctx)
        await store.close()
    wait = parked.value
    assert not wait.drained and wait.until == pytest.approx(time.time() + 20, abs=2)
    assert wait.waiting_for == {
        "kind": "rate_limit",
        "bucket": "anthropic",
        "reason": "paused",
        "invocation_id": "job-s/0/0",
    }
    assert llm.requests == []


async def test_waits_in_the_process_add_up_to_park_after_then_park(tmp_path: Path) -> None:
    """Many short waits are one long wait: past park_after in all, the job parks rather than hold a slot."""
    llm = ScriptedLLM([ScriptedTurn.http_error(429, retry_after=0.1)] * 10 + [ScriptedTurn.text("x")])
    async with step_contexts(tmp_path) as make:
        ctx, journal = await make(llm)
        rate, store = await limiter_on(tmp_path)
        ctx._env.limiter = rate
        with pytest.raises(WaitParked):
            await call(ctx)
        events = [e["type"] for e in await journal_events(journal)]
        await store.close()
    assert 2 <= len(llm.requests) <= 5 and "RETRY" not in events


def test_job_show_and_the_console_say_a_parked_job_waits_for_a_rate_limit() -> None:
    from agentlife._jobs._view import _wait_lines
    from agentlife.stores._waits import WaitState

    what = {"kind": "rate_limit", "bucket": "anthropic", "reason": "paused", "invocation_id": "j/0/1"}
    (line,) = _wait_lines(WaitState("WAITING", 1_900_000_000.0, what))
    assert line.startswith("waits for   rate limit anthropic until ") and line.endswith("(j/0/1)")


async def test_the_stream_guards_timers_do_not_run_while_the_call_waits_for_capacity(tmp_path: Path) -> None:
    """A wait five times the total LLM timeout: the call still completes, with no timeout and no retry."""
    llm = ScriptedLLM([ScriptedTurn.text("in time")])
    async with step_contexts(tmp_path) as make:  # scaled by 0.01: total timeout 0.05 s, park_after 0.3 s
        ctx, journal = await make(
            llm, AGENTLIFE_LLM_CONNECT_TIMEOUT_SECONDS="2", AGENTLIFE_LLM_TOTAL_TIMEOUT_SECONDS="5"
        )
        rate, store = await limiter_on(tmp_path)
        ctx._env.limiter = rate
        await store.pause_rate_bucket("anthropic", CAPS, time.time() + 0.25)
        reply = await call(ctx)
        events = [e["type"] for e in await journal_events(journal)]
        await store.close()
    assert reply.text == "in time" and "RETRY" not in events
    assert rate.stats["anthropic"].wait_seconds >= 0.2
