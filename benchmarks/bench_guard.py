"""What the stream guard costs per chunk, next to plain ``async for`` and the naive per-item timeouts.

Two sources of 200 000 items: one that suspends on every item (``await asyncio.sleep(0)``, like network
I/O: target <= 1.3x plain) and one that never suspends (the worst case for any wrapper: target <= 2x).
For each, in the same run: plain ``async for`` (the baseline), ``guard_stream``, ``asyncio.timeout``
re-armed around every ``__anext__`` and ``asyncio.wait_for`` on every ``__anext__`` (a task per item).
Rounds are interleaved and the best round of each counts, so a noisy neighbour on a shared machine hurts
every variant alike; the naive variants run 20 000 items (their per-item cost does not depend on it).

Run: python benchmarks/bench_guard.py  (one JSON object per line)
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from agentlife._llm._guard import guard_stream
from agentlife._llm._protocol import StreamTimeouts

N = 200_000
# The naive variants cost 10-300x more per item; fewer items give the same per-item figure in less time.
N_NAIVE = 20_000
TIMEOUTS = StreamTimeouts(connect=30.0, chunk=60.0, total=300.0)

Consumer = Callable[[AsyncIterator[int]], Awaitable[int]]


def emit(
    metric: str,
    value: float,
    unit: str,
    target: str,
    passed: bool,
    baseline: float | None = None,
    ratio: float | None = None,
) -> None:
    print(
        json.dumps(
            {
                "bench": "guard",
                "metric": metric,
                "value": round(value, 3),
                "unit": unit,
                "baseline": None if baseline is None else round(baseline, 3),
                "ratio": None if ratio is None else round(ratio, 3),
                "target": target,
                "pass": bool(passed),
            }
        ),
        flush=True,
    )


async def suspending(n: int) -> AsyncIterator[int]:
    for i in range(n):
        await asyncio.sleep(0)
        yield i


async def immediate(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


async def plain(source: AsyncIterator[int]) -> int:
    count = 0
    async for _ in source:
        count += 1
    return count


async def guarded(source: AsyncIterator[int]) -> int:
    count = 0
    async for _ in guard_stream(source, TIMEOUTS):
        count += 1
    return count


async def timeout_per_item(source: AsyncIterator[int]) -> int:
    count = 0
    while True:
        try:
            async with asyncio.timeout(TIMEOUTS.chunk):
                await source.__anext__()
        except StopAsyncIteration:
            return count
        count += 1


async def wait_for_per_item(source: AsyncIterator[int]) -> int:
    count = 0
    while True:
        try:
            await asyncio.wait_for(source.__anext__(), TIMEOUTS.chunk)
        except StopAsyncIteration:
            return count
        count += 1


async def timed(consumer: Consumer, make: Callable[[int], AsyncIterator[int]], n: int) -> float:
    """Nanoseconds per item for one full pass over ``n`` items."""
    source = make(n)
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        count = await consumer(source)
        elapsed = time.perf_counter() - started
    finally:
        gc.enable()
    assert count == n, (consumer.__name__, count)
    return elapsed / n * 1e9


async def best_of(make: Callable[[int], AsyncIterator[int]], rounds: int) -> dict[str, float]:
    """The best ns/item of each variant; plain and guard interleaved round by round."""
    best: dict[str, float] = {}
    plan: list[tuple[Consumer, int, int]] = [(plain, N, rounds), (guarded, N, rounds)]
    plan += [(timeout_per_item, N_NAIVE, 2), (wait_for_per_item, N_NAIVE, 2)]
    for round_number in range(rounds):
        for consumer, n, wanted in plan:
            if round_number < wanted:
                ns = await timed(consumer, make, n)
                best[consumer.__name__] = min(ns, best.get(consumer.__name__, ns))
    return best


def report(kind: str, best: dict[str, float], target: float) -> None:
    base = best["plain"]
    emit(f"{kind}_plain_async_for_per_chunk", base, "ns", "baseline", True)
    ratio = best["guarded"] / base
    emit(f"{kind}_guard_per_chunk", best["guarded"], "ns", f"<= {target:g}x", ratio <= target, base, ratio)
    for name in ("timeout_per_item", "wait_for_per_item"):
        ratio = best[name] / base
        # The naive ways are the comparison, not a target: they "pass" when the guard beats them.
        emit(
            f"{kind}_naive_{name}_per_chunk",
            best[name],
            "ns",
            "reference (guard must be cheaper)",
            best["guarded"] < best[name],
            base,
            ratio,
        )


async def main() -> None:
    await best_of(immediate, 1)  # warm-up: imports, code objects, allocator
    report("suspending", await best_of(suspending, 5), 1.3)
    report("immediate", await best_of(immediate, 20), 2.0)


if __name__ == "__main__":
    asyncio.run(main())
