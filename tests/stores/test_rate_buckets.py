"""The fleet-wide rate-limit buckets on both stores: draws, give-backs, pauses, in-flight slots and kills.

The property test runs random sequences of draws, give-backs, pauses, slot ends and kills (a holder that
vanishes with its slots and its slice) against a model of the bucket, on a clock the test moves, and checks
after every step that the levels stay within ``[0, limit]``, match the model, and that no slot outlives
its lease.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentlife.stores import CheckpointStore, PostgresStore, SQLiteStore, TableNames
from agentlife.stores._ratebuckets import IN_FLIGHT_POLL_SECONDS, MAX_PAUSE_SECONDS, RateDraw, refill

pytestmark = pytest.mark.anyio

CAPS = (600, 200_000, 80_000)
KEY = "anthropic"


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[CheckpointStore]:
    opened: CheckpointStore
    if request.param == "sqlite":
        opened = SQLiteStore(tmp_path / "agentlife.db")
    else:
        url = request.getfixturevalue("postgres_url")
        opened = PostgresStore(
            url, tables=TableNames(rate_bucket=f"rb_{id(request)}", rate_slot=f"rs_{id(request)}")
        )
    await opened.open()
    await opened.init_schema()
    yield opened
    await opened.close()


class Clock:
    """The stores' transaction clock, moved by the test (``tx.now`` reads ``time.time``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, start: float = 1_800_000_000.0) -> None:
        self.now = start
        import agentlife.stores._postgres as pg
        import agentlife.stores._sqlite as lite

        for module in (pg, lite):  # those modules' time only: the event loop keeps the real clock
            monkeypatch.setattr(module, "time", _Time(self))


class _Time:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def time(self) -> float:
        return self._clock.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


def draw(
    need: tuple[float, float, float] = (1, 1000, 1),
    want: tuple[float, float, float] = (10, 5000, 0),
    **kw: Any,
) -> RateDraw:
    return RateDraw(need=need, want=want, **kw)


async def test_a_first_draw_finds_a_full_bucket_and_takes_its_slice(
    store: CheckpointStore, clock: Clock
) -> None:
    grant = await store.draw_rate_capacity(KEY, CAPS, draw())
    assert grant.wait == 0 and grant.granted == (10, 5000, 1)  # at least the need of each
    levels, paused, slots = await store.rate_bucket_levels(KEY, CAPS) or ((), 0, 0)
    assert levels == (590, 195_000, 79_999) and paused == 0 and slots == 0


async def test_an_empty_bucket_says_how_long_until_the_need_fits(
    store: CheckpointStore, clock: Clock
) -> None:
    await store.draw_rate_capacity(KEY, CAPS, draw(need=(1, 200_000, 1), want=(1, 200_000, 0)))
    grant = await store.draw_rate_capacity(KEY, CAPS, draw(need=(1, 20_000, 1)))
    assert grant.granted == (0, 0, 0) and grant.reason == "input_tokens"
    assert grant.wait == pytest.approx(6.0)  # 20 000 of 200 000 a minute
    clock.now += 6.0
    assert (await store.draw_rate_capacity(KEY, CAPS, draw(need=(1, 20_000, 1), want=(1, 1, 0)))).wait == 0


async def test_what_a_slice_gives_back_never_lifts_a_level_past_its_limit_nor_below_zero(
    store: CheckpointStore, clock: Clock
) -> None:
    await store.draw_rate_capacity(KEY, CAPS, draw())
    await store.return_rate_capacity(KEY, CAPS, (1e9, 1e9, 1e9))
    levels, _, _ = await store.rate_bucket_levels(KEY, CAPS) or ((), 0, 0)
    assert levels == (600, 200_000, 80_000)
    await store.return_rate_capacity(KEY, CAPS, (-1e9, -1e9, -math.inf))
    levels, _, _ = await store.rate_bucket_levels(KEY, CAPS) or ((), 0, 0)
    assert levels == (0, 0, 80_000)  # -inf is not a number a slice can owe: ignored


async def test_a_pause_holds_every_draw_until_it_ends_and_never_shortens(
    store: CheckpointStore, clock: Clock
) -> None:
    await store.pause_rate_bucket(KEY, CAPS, clock.now + 10)
    await store.pause_rate_bucket(KEY, CAPS, clock.now + 2)  # a shorter one later does not shorten it
    grant = await store.draw_rate_capacity(KEY, CAPS, draw())
    assert grant.reason == "paused" and grant.wait == pytest.approx(10)
    clock.now += 10
    assert (await store.draw_rate_capacity(KEY, CAPS, draw())).wait == 0


async def test_a_remaining_count_narrows_a_level_and_never_raises_one(
    store: CheckpointStore, clock: Clock
) -> None:
    await store.pause_rate_bucket(KEY, CAPS, 0, (5, None, -3))
    levels, _, _ = await store.rate_bucket_levels(KEY, CAPS) or ((), 0, 0)
    assert levels == (5, 200_000, 0)
    await store.pause_rate_bucket(KEY, CAPS, 0, (500, None, None))
    assert (await store.rate_bucket_levels(KEY, CAPS) or ((),))[0][0] == 5


async def test_a_clock_that_went_back_refills_nothing(store: CheckpointStore, clock: Clock) -> None:
    await store.draw_rate_capacity(KEY, CAPS, draw(need=(600, 1, 1), want=(600, 1, 0)))
    clock.now -= 3600
    grant = await store.draw_rate_capacity(KEY, CAPS, draw())
    assert grant.reason == "requests" and grant.wait == pytest.approx(0.1)


async def test_in_flight_slots_are_counted_fleet_wide_and_a_dead_holders_slot_ends_with_its_lease(
    store: CheckpointStore, clock: Clock
) -> None:
    first = await store.draw_rate_capacity(KEY, CAPS, draw(slot="a", in_flight=2, slot_until=clock.now + 30))
    second = await store.draw_rate_capacity(KEY, CAPS, draw(slot="b", in_flight=2, slot_until=clock.now + 30))
    third = await store.draw_rate_capacity(KEY, CAPS, draw(slot="c", in_flight=2, slot_until=clock.now + 30))
    assert (first.wait, second.wait) == (0, 0)
    assert third.reason == "in_flight" and third.wait == IN_FLIGHT_POLL_SECONDS and third.granted == (0, 0, 0)
    await store.return_rate_capacity(KEY, CAPS, (0, 0, 0), "a")  # a call that ended gives its slot back
    assert (
        await store.draw_rate_capacity(KEY, CAPS, draw(slot="c", in_flight=2, slot_until=clock.now + 30))
    ).wait == 0
    # "b" and "c" belong to a process that was SIGKILLed: nobody returns them; their lease ends them.
    assert (
        await store.draw_rate_capacity(KEY, CAPS, draw(slot="d", in_flight=2, slot_until=clock.now + 30))
    ).wait > 0
    clock.now += 30
    assert (
        await store.draw_rate_capacity(KEY, CAPS, draw(slot="d", in_flight=2, slot_until=clock.now + 30))
    ).wait == 0
    assert (await store.rate_bucket_levels(KEY, CAPS) or ((), 0, 0))[2] == 1


async def test_a_bucket_row_written_badly_is_read_as_empty_not_as_a_crash(
    store: CheckpointStore, clock: Clock
) -> None:
    await store.draw_rate_capacity(KEY, CAPS, draw())
    await store.return_rate_capacity(KEY, CAPS, (math.nan, math.nan, math.nan))  # ignored, not stored
    levels, _, _ = await store.rate_bucket_levels(KEY, CAPS) or ((), 0, 0)
    assert all(isinstance(v, float) and math.isfinite(v) for v in levels)


async def test_a_pause_from_a_clock_a_day_ahead_holds_the_fleet_at_most_the_bound_said_once(
    store: CheckpointStore, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A pod with a clock a day ahead writes "now + pause" after a 429: the others wait 60 s, not a day."""
    here = clock.now
    clock.now = here + 86_400.0
    await store.pause_rate_bucket(KEY, CAPS, clock.now + 30)
    clock.now = here
    with caplog.at_level(logging.WARNING, logger="agentlife.ratelimit"):
        grant = await store.draw_rate_capacity(KEY, CAPS, draw())
        again = await store.draw_rate_capacity(KEY, CAPS, draw())
    assert grant.reason == "paused" and grant.wait == pytest.approx(MAX_PAUSE_SECONDS)
    assert again.wait == pytest.approx(MAX_PAUSE_SECONDS)  # the row was repaired, not read afresh
    said = [r.getMessage() for r in caplog.records if "store's pause" in r.getMessage()]
    assert len(said) == 1 and "pausing 60 s" in said[0], said
    clock.now += MAX_PAUSE_SECONDS
    assert (await store.draw_rate_capacity(KEY, CAPS, draw())).wait == 0


@pytest.mark.parametrize("until", [1e300, math.inf])
async def test_a_pause_asked_past_the_bound_is_stored_within_it(
    store: CheckpointStore, clock: Clock, until: float
) -> None:
    await store.pause_rate_bucket(KEY, CAPS, until)
    _, paused, _ = await store.rate_bucket_levels(KEY, CAPS) or ((), 0, 0)
    assert paused == pytest.approx(clock.now + MAX_PAUSE_SECONDS)
    grant = await store.draw_rate_capacity(KEY, CAPS, draw())
    assert grant.reason == "paused" and grant.wait == pytest.approx(MAX_PAUSE_SECONDS)


# -- the property test: random draws, give-backs, pauses and kills against a model -------------------------


@dataclass
class Model:
    """The bucket as it should be: levels refilled on the test's clock, slots with their lease ends."""

    at: float
    levels: list[float] = field(default_factory=lambda: [float(c) for c in CAPS])
    paused_until: float = 0.0
    slots: dict[str, float] = field(default_factory=dict)

    def advance(self, now: float) -> None:
        elapsed = max(0.0, now - self.at)
        self.levels = [refill(level, cap, elapsed) for level, cap in zip(self.levels, CAPS, strict=True)]
        self.at = max(self.at, now)

    def give(self, amounts: tuple[float, float, float]) -> None:
        for i, amount in enumerate(amounts):
            if math.isfinite(amount):
                self.levels[i] = min(float(CAPS[i]), max(0.0, self.levels[i] + amount))


async def check_random_run(store: CheckpointStore, clock: Clock, rng: random.Random, steps: int) -> None:
    model = Model(clock.now)
    held: dict[str, list[str]] = {"p1": [], "p2": [], "p3": []}  # each process's live slots
    in_flight = 3
    await store.pause_rate_bucket(KEY, CAPS, 0)  # the row exists from here on: a pause that ended long ago
    for step in range(steps):
        clock.now += rng.choice([0.0, 0.05, 0.5, 3.0, 40.0])
        model.advance(clock.now)
        holder = rng.choice(sorted(held))
        action = rng.random()
        if action < 0.5:
            need = (1.0, float(rng.choice([1, 500, 20_000, 300_000])), 1.0)
            want = (
                float(rng.randint(1, 300)),
                need[1] + rng.choice([0, 3000, 90_000]),
                float(rng.choice([0, 1000])),
            )
            # what a slice left, or overspent: enough to empty a bucket, or to overflow it
            give = (rng.uniform(-400, 50), rng.uniform(-150_000, 20_000), rng.uniform(-90_000, 100))
            slot = f"s{step}" if rng.random() < 0.5 else None
            grant = await store.draw_rate_capacity(
                KEY, CAPS, RateDraw(need, want, give, slot, in_flight if slot else None, clock.now + 30)
            )
            model.give(give)
            expired = [s for s, until in model.slots.items() if until <= clock.now]
            live = len(model.slots) - len(expired)
            fits = model.paused_until <= clock.now and all(
                model.levels[i] >= min(need[i], CAPS[i]) - 1e-6 for i in range(3)
            )
            if fits and slot is not None:
                for s in expired:
                    del model.slots[s]
                fits = live < in_flight
            assert (grant.wait == 0) == fits, (step, grant, model)
            if fits:
                for i in range(3):
                    taken = min(model.levels[i], max(need[i], want[i]))
                    assert grant.granted[i] == pytest.approx(taken, rel=1e-9, abs=1e-6)
                    model.levels[i] = max(0.0, model.levels[i] - taken)
                if slot is not None:
                    model.slots[slot] = clock.now + 30
                    held[holder].append(slot)
        elif action < 0.65 and held[holder]:
            slot = held[holder].pop(rng.randrange(len(held[holder])))
            give = (0.0, rng.uniform(-2000, 2000), 0.0)
            await store.return_rate_capacity(KEY, CAPS, give, slot)
            model.give(give)
            model.slots.pop(slot, None)
        elif action < 0.75:
            until = clock.now + rng.choice([0.5, 5.0, 60.0])
            remaining = (rng.choice([None, 0.0, 3.0]), rng.choice([None, 100.0]), None)
            await store.pause_rate_bucket(KEY, CAPS, until, remaining)
            model.paused_until = max(model.paused_until, until)
            for i, left in enumerate(remaining):
                if left is not None:
                    model.levels[i] = min(model.levels[i], left)
        else:  # SIGKILL: the holder's slots are never returned; a new process takes its name
            held[holder] = []
        stored = await store.rate_bucket_levels(KEY, CAPS)
        assert stored is not None
        levels, _, live_slots = stored
        for i in range(3):
            assert levels[i] is not None and 0.0 <= levels[i] <= CAPS[i], (step, levels)
            assert levels[i] == pytest.approx(model.levels[i], rel=1e-9, abs=1e-6), (step, levels, model)
        assert live_slots == sum(1 for until in model.slots.values() if until > clock.now)
        assert live_slots <= in_flight
    clock.now += 31  # every lease has ended: every slot of the killed holders is back
    assert (await store.rate_bucket_levels(KEY, CAPS) or ((), 0, -1))[2] == 0


@pytest.mark.parametrize("seed", [1])
async def test_random_draws_and_kills_keep_the_bucket_within_bounds_and_equal_to_its_model(
    store: CheckpointStore, clock: Clock, seed: int
) -> None:
    await check_random_run(store, clock, random.Random(seed), steps=150)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rng=st.randoms(use_true_random=False))
def test_hypothesis_finds_no_sequence_that_breaks_the_bucket(
    rng: random.Random, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same run, hypothesis choosing (and shrinking) each draw, give-back, pause and kill (SQLite)."""

    async def run() -> None:
        store = SQLiteStore(tmp_path_factory.mktemp("bucket") / "agentlife.db")
        await store.open()
        try:
            await check_random_run(store, Clock(monkeypatch), rng, steps=50)
        finally:
            await store.close()

    anyio.run(run)
