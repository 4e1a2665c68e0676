"""The fleet-wide rate limiter's cost on a model call: none without a limit, little on an idle bucket.

Run: python benchmarks/bench_ratelimit.py  (one JSON object per line)

Each figure is a call through `limited_attempt` (or the bare attempt, the baseline, measured in the same
run) whose model answers at once, so what is measured is the limiter alone: on an idle bucket (capacity to
spare) on SQLite and on PostgreSQL, with and without an in-flight limit (which costs a statement at each
call's start and end), and the no-limit path (the context variable the adapters look at). Statements per
call are counted at the store.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit

from _pg import running_postgres
from agentlife._llm._protocol import LLMReply
from agentlife._llm._ratelimit_headers import response_seen
from agentlife._llm._ratelimiter import RateLimiter
from agentlife._ratelimit import RateLimit, RateLimits
from agentlife._step._ratewait import limited_attempt
from agentlife.stores import CheckpointStore, PostgresStore, SQLiteStore

REPLY = LLMReply(text="ok")
TARGET_US = 300.0


class Counting:
    """The store's bucket operations, counted."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store, self.statements = store, 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.statements += 1
            return await method(*args, **kwargs)

        return counted


async def answer() -> LLMReply:
    return REPLY


async def answer_seen() -> LLMReply:
    response_seen(200, {})  # what an adapter does for every response: a lookup when no limit is set
    return REPLY


async def no_wait(bucket: str, reason: str, seconds: float) -> None:
    raise AssertionError(f"an idle bucket made a call wait ({reason}, {seconds:.3f} s)")


async def per_call_us(call: Callable[[], Awaitable[LLMReply]], n: int) -> float:
    """The median of 5 rounds of ``n`` calls, in microseconds per call."""
    rounds = []
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(n):
            await call()
        rounds.append((time.perf_counter() - began) / n * 1e6)
    return statistics.median(rounds)


async def bench_store(store: CheckpointStore, label: str, n: int) -> None:
    await store.open()
    await store.init_schema()
    try:
        bare = await per_call_us(answer, n)
        # A limit far above what the benchmark spends: the bucket stays idle, as most are most of the time.
        for name, limit in (
            ("idle", RateLimit(f"bench-{label}", 10**8, 10**9, 10**9)),
            ("idle_in_flight", RateLimit(f"bench-{label}-if", 10**8, 10**9, 10**9, in_flight=10**6)),
        ):
            counting = Counting(store)
            limiter = RateLimiter(counting, RateLimits(limit), slot_lease_seconds=60, store_down_seconds=30)  # type: ignore[arg-type]
            limited = limited_attempt(limiter, answer, model="m", estimate=500, wait=no_wait)
            await limited()  # the first draw makes the bucket's row
            counting.statements = 0
            cost = await per_call_us(limited, n)
            statements = counting.statements / (5 * n)
            extra = cost - bare
            if name == "idle":
                target, ok = f"<= {TARGET_US:g} us over a bare call, <= 1 statement", extra <= TARGET_US
            else:  # a slot is a row each call takes and gives back: two commits, whatever they cost
                target, ok = "reference: two commits per call (a slot taken, a slot returned)", True
            emit(
                "ratelimit",
                f"{label}_{name}_overhead_per_call",
                extra,
                "us",
                baseline=bare,
                target=target,
                ok=ok and statements <= (1 if name == "idle" else 2),
                statements_per_call=round(statements, 4),
            )
    finally:
        await store.close()


async def bench_no_limit(n: int) -> None:
    bare = await per_call_us(answer, n * 10)
    seen = await per_call_us(answer_seen, n * 10)
    emit(
        "ratelimit",
        "no_limit_overhead_per_call",
        seen - bare,
        "us",
        baseline=bare,
        target="<= 1 us: no statement, no lock, one context-variable lookup",
        ok=seen - bare <= 1.0,
        statements_per_call=0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="calls per round")
    args = parser.parse_args()
    asyncio.run(bench_no_limit(args.n))
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(bench_store(SQLiteStore(Path(tmp) / "agentlife.db"), "sqlite", args.n))
    with running_postgres(fast=False) as server:
        asyncio.run(bench_store(PostgresStore(server.create_database("bench")), "postgresql", args.n))


if __name__ == "__main__":
    main()
