"""The fleet-wide rate limiter against the fake model servers' enforced limits, and what it believes.

Several `RateLimiter`s on one store stand for several processes of a fleet. The fake servers enforce the
account's limits as the providers do (429 with ``retry-after`` and the rate-limit headers), so the
limiter is tested against the real protocol shapes: adapters report each response's headers, a 429
pauses the shared bucket for every limiter, a low ``remaining`` narrows it, and a header that lies is
logged and dropped.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentlife import AnthropicLLM, OpenAICompatibleLLM
from agentlife._exceptions import StoreUnavailable, TransientError
from agentlife._llm._protocol import LLMReply, StreamTimeouts
from agentlife._llm._ratelimit_headers import MAX_RESET_SECONDS, parse_duration, provider_view
from agentlife._llm._ratelimiter import MAX_PAUSE_SECONDS, RateLimiter
from agentlife._ratelimit import RateLimit, RateLimits
from agentlife._step._ratewait import MAX_RATE_LIMITED, limited_attempt
from agentlife.stores import CheckpointStore, PostgresStore, SQLiteStore, TableNames
from agentlife.stores._ratebuckets import RateDraw
from agentlife.testing import FakeAnthropicServer, FakeOpenAIServer, ProviderLimits

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hello"}]
FAST = StreamTimeouts(5.0, 5.0, 10.0)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[CheckpointStore]:
    opened = SQLiteStore(tmp_path / "agentlife.db")
    await opened.open()
    yield opened
    await opened.close()


def limits(**values: int) -> RateLimits:
    return RateLimits(RateLimit("anthropic", **values))


def limiter(store: Any, rate_limits: RateLimits, **kw: Any) -> RateLimiter:
    return RateLimiter(
        store, rate_limits, slot_lease_seconds=30.0, store_down_seconds=kw.pop("down", 30.0), **kw
    )


class Waits:
    """The waits a call was told to make, made for real (short ones) and recorded."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, float]] = []

    async def __call__(self, bucket: str, reason: str, seconds: float) -> None:
        self.seen.append((bucket, reason, seconds))
        await anyio.sleep(seconds)


def calls(llm: Any, rate: RateLimiter, waits: Waits) -> Callable[[], Awaitable[LLMReply]]:
    def attempt() -> Awaitable[LLMReply]:
        return llm.complete(model="claude-sonnet-4-5", messages=MESSAGES, max_tokens=50, timeouts=FAST)  # type: ignore[no-any-return]

    return limited_attempt(rate, attempt, model="claude-sonnet-4-5", estimate=10, wait=waits)  # type: ignore[arg-type]


async def drain_store(
    store: CheckpointStore, key: str, caps: tuple[int | None, int | None, int | None]
) -> None:
    """Another process took everything the bucket had."""
    whole = tuple(float(c or 0) for c in caps)
    await store.draw_rate_capacity(key, caps, RateDraw(need=(0, 0, 0), want=whole))  # type: ignore[arg-type]


async def test_calls_past_an_empty_bucket_wait_their_turn_and_the_provider_refuses_none(
    store: CheckpointStore,
) -> None:
    async with FakeAnthropicServer(
        default_turn="ok", limits=ProviderLimits(requests_per_minute=600)
    ) as server:
        server.spend(requests=600)  # the account is spent, here and in the fleet's bucket
        await drain_store(store, "anthropic", (600, None, None))
        rate, waits = limiter(store, limits(requests_per_minute=600)), Waits()
        llm = AnthropicLLM(api_key="k", base_url=server.base_url, env={})
        replies: list[LLMReply] = []
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(lambda: _append(replies, calls(llm, rate, waits)))
        await llm.aclose()
    assert len(replies) == 4 and server.rate_limited == 0
    assert waits.seen and all(reason == "requests" for _, reason, _ in waits.seen)
    assert rate.stats["anthropic"].waits == len(waits.seen) and rate.stats["anthropic"].waiting == 0


async def _append(out: list[LLMReply], call: Callable[[], Awaitable[LLMReply]]) -> None:
    out.append(await call())


async def test_a_429_pauses_the_bucket_for_every_process_of_the_fleet(store: CheckpointStore) -> None:
    """The account was spent by someone the fleet does not know: one call learns it, the other waits."""
    async with FakeAnthropicServer(
        default_turn="ok", limits=ProviderLimits(requests_per_minute=120)
    ) as server:
        # Two requests a second come back: the first call must arrive within half a second (it does, by
        # far), and after the 1 s pause there is room for both.
        server.spend(requests=120)
        first, second = (
            limiter(store, limits(requests_per_minute=120)),
            limiter(store, limits(requests_per_minute=120)),
        )
        llm = AnthropicLLM(api_key="k", base_url=server.base_url, env={})
        waits_first, waits_second = Waits(), Waits()
        replies: list[LLMReply] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _append(replies, calls(llm, first, waits_first)))
            with anyio.fail_after(5):
                while not first.stats.get("anthropic") or not first.stats["anthropic"].rate_limited:
                    await anyio.sleep(0.01)
            sent = len(server.requests)
            tg.start_soon(lambda: _append(replies, calls(llm, second, waits_second)))
        await llm.aclose()
    assert len(replies) == 2 and server.rate_limited == 1  # one 429 taught the fleet
    assert waits_first.seen[0][1] == "paused" and 0 < waits_first.seen[0][2] <= 1.0
    assert waits_second.seen and waits_second.seen[0][1] == "paused"  # from the store: it never saw a 429
    assert len(server.requests) == sent + 2  # after the pause, one request each


def _permit(rate: RateLimiter) -> Any:
    from agentlife._llm._ratelimiter import Permit

    return Permit("claude-sonnet-4-5", 10)


async def test_a_rate_limit_header_with_little_left_narrows_the_fleets_bucket(store: CheckpointStore) -> None:
    async with FakeAnthropicServer(
        default_turn="ok", limits=ProviderLimits(requests_per_minute=600)
    ) as server:
        server.spend(requests=590)  # ten left at the provider; the fleet's bucket thinks 600
        rate = limiter(store, limits(requests_per_minute=600))
        llm = AnthropicLLM(api_key="k", base_url=server.base_url, env={})
        await calls(llm, rate, Waits())()
        await llm.aclose()
    levels, _, _ = await store.rate_bucket_levels("anthropic", (600, None, None)) or ((), 0, 0)
    assert levels[0] < 15  # narrowed to what the provider said was left, not 590 more
    assert rate.stats["anthropic"].narrowed == 1


async def test_openai_rate_limit_headers_and_429_are_learned_the_same_way(store: CheckpointStore) -> None:
    provider = ProviderLimits(requests_per_minute=120, input_tokens_per_minute=100_000)
    async with FakeOpenAIServer(default_turn="ok", limits=provider) as server:
        server.spend(requests=120)  # two a second come back: the call arrives well within half a second
        rate, waits = limiter(store, RateLimits(RateLimit("openai", 120, 100_000))), Waits()
        llm = OpenAICompatibleLLM(server.base_url, api_key="k", timeouts=FAST)
        reply = await calls(llm, rate, waits)()
        await llm.aclose()
    assert reply.text and server.rate_limited == 1 and rate.stats["openai"].rate_limited == 1
    assert waits.seen[0][1] == "paused"


async def test_a_provider_that_always_answers_429_goes_to_the_ordinary_retries_after_a_bound(
    store: CheckpointStore,
) -> None:
    rate, waits = limiter(store, limits(requests_per_minute=600)), Waits()
    sent = 0

    async def refused() -> LLMReply:
        nonlocal sent
        sent += 1
        error = TransientError("429", retry_after=0.01)
        setattr(error, "status_code", 429)  # noqa: B010
        raise error

    with pytest.raises(TransientError):
        await limited_attempt(rate, refused, model="m", estimate=1, wait=waits)()
    assert sent == MAX_RATE_LIMITED + 1


async def test_a_retry_after_of_a_year_pauses_the_fleet_for_the_bound_and_says_so(
    store: CheckpointStore, caplog: pytest.LogCaptureFixture
) -> None:
    rate = limiter(store, limits(requests_per_minute=600))
    with caplog.at_level(logging.WARNING, "agentlife.ratelimit"):
        assert await rate.learn(_permit(rate), 429, {}, 365 * 86400.0)
    _, paused_until, _ = await store.rate_bucket_levels("anthropic", (600, None, None)) or ((), 0, 0)
    assert paused_until - time.time() == pytest.approx(MAX_PAUSE_SECONDS, abs=5)
    assert "pausing 60 s" in caplog.text


async def test_a_529_without_retry_after_is_an_ordinary_retry_not_a_fleet_pause(
    store: CheckpointStore,
) -> None:
    rate = limiter(store, limits(requests_per_minute=600))
    assert not await rate.learn(_permit(rate), 529, {}, None)
    assert await rate.learn(_permit(rate), 529, {}, 2.0)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_with_the_store_down_calls_wait_for_it_then_go_on_without_the_fleets_limit(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    down: CheckpointStore
    if kind == "sqlite":
        down = SQLiteStore(tmp_path / "agentlife.db")
    else:
        down = PostgresStore(request.getfixturevalue("postgres_url"), tables=TableNames())
    await down.open()
    await down.close()  # closed: every statement raises StoreUnavailable, as a server that went away
    with pytest.raises(StoreUnavailable):
        await down.rate_bucket_levels("anthropic", (600, None, None))
    rate, waits = limiter(down, limits(requests_per_minute=600), down=0.3), Waits()

    async def answer() -> LLMReply:
        return LLMReply(text="ok")

    with caplog.at_level(logging.WARNING, "agentlife.ratelimit"):
        reply = await limited_attempt(rate, answer, model="m", estimate=1, wait=waits)()
        again = await limited_attempt(rate, answer, model="m", estimate=1, wait=waits)()
    assert reply.text == again.text == "ok"
    assert waits.seen and {reason for _, reason, _ in waits.seen} == {"store"}
    assert sum(seconds for _, _, seconds in waits.seen) == pytest.approx(0.3, abs=0.05)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 2, said  # the docs' two WARNINGs, each once per outage
    assert "calls wait for it" in said[0] and "calls go on without the fleet's limit" in said[1]


async def test_a_slot_is_given_back_when_the_call_fails_or_is_cancelled(store: CheckpointStore) -> None:
    rate = limiter(store, limits(requests_per_minute=600, in_flight=1))

    async def fails() -> LLMReply:
        raise TransientError("boom")

    with pytest.raises(TransientError):
        await limited_attempt(rate, fails, model="m", estimate=1, wait=Waits())()
    assert (await store.rate_bucket_levels("anthropic", (600, None, None)) or ((), 0, -1))[2] == 0

    async def hangs() -> LLMReply:
        await anyio.sleep_forever()
        raise AssertionError

    with anyio.move_on_after(0.2):
        await limited_attempt(rate, hangs, model="m", estimate=1, wait=Waits())()
    assert (await store.rate_bucket_levels("anthropic", (600, None, None)) or ((), 0, -1))[2] == 0


async def test_a_model_with_limits_of_its_own_draws_on_both_buckets(store: CheckpointStore) -> None:
    both = RateLimits(RateLimit("acct", 600), {"big": RateLimit("acct/big", 60)})
    rate = limiter(store, both)

    async def answer() -> LLMReply:
        return LLMReply(text="ok")

    await limited_attempt(rate, answer, model="big", estimate=1, wait=Waits())()
    await limited_attempt(rate, answer, model="small", estimate=1, wait=Waits())()
    assert set(rate.stats) == {"acct", "acct/big"}
    assert await store.rate_bucket_levels("acct/big", (60, None, None)) is not None


# -- what providers say, read defensively ------------------------------------------------------------------


def lies() -> tuple[list[str], Callable[[str], None]]:
    said: list[str] = []
    return said, said.append


def test_anthropic_headers_are_read_per_dimension_with_their_reset() -> None:
    reset = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=20)).strftime("%Y-%m-%dT%H:%M:%SZ")
    said, on_lie = lies()
    view = provider_view(
        {
            "Anthropic-RateLimit-Requests-Limit": "600",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": reset,
            "anthropic-ratelimit-input-tokens-remaining": "1500",
            "anthropic-ratelimit-output-tokens-remaining": "90",
        },
        on_lie=on_lie,
    )
    assert view.remaining == (0, 1500, 90) and not said
    assert view.reset[0] == pytest.approx(20, abs=2)
    assert view.reset_when_exhausted() == view.reset[0]


@pytest.mark.parametrize(
    ("headers", "needle"),
    [
        (
            {"anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "900"},
            "more than",
        ),
        ({"anthropic-ratelimit-requests-remaining": "-1"}, "not a count"),
        ({"anthropic-ratelimit-requests-remaining": "nan"}, "not a count"),
        ({"anthropic-ratelimit-requests-remaining": "1e300"}, "not a count"),
        ({"anthropic-ratelimit-requests-remaining": "lots"}, "not a count"),
        ({"anthropic-ratelimit-requests-remaining": "9" * 5000}, "not a count"),
        ({"x-ratelimit-remaining-tokens": "\x00"}, "not a count"),
    ],
)
def test_a_remaining_count_that_lies_is_dropped_and_said(headers: dict[str, str], needle: str) -> None:
    said, on_lie = lies()
    assert provider_view(headers, on_lie=on_lie).remaining == (None, None, None)
    assert len(said) == 1 and needle in said[0] and len(said[0]) < 200


@pytest.mark.parametrize(
    "reset",
    ["2001-01-01T00:00:00Z", "yesterday", "", "2999-13-45T99:99:99Z", "2030-01-01T00:00:00", "x" * 10_000],
)
def test_a_reset_in_the_past_or_unreadable_pauses_nothing(reset: str) -> None:
    said, on_lie = lies()
    view = provider_view(
        {"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": reset},
        on_lie=on_lie,
    )
    assert view.remaining[0] == 0 and view.reset[0] is None and said


def test_a_reset_far_away_is_believed_only_up_to_a_minute() -> None:
    _, on_lie = lies()
    view = provider_view(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "9999h"}, on_lie=on_lie
    )
    assert view.reset[0] == MAX_RESET_SECONDS


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("0.5s", 0.5)],
)
def test_openai_reset_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "1", "-1s", "1x", "1s2", "1.s", "1s " * 30, "1" * 50 + "s", "1ss"])
def test_openai_reset_durations_that_are_not_durations_are_none(text: str) -> None:
    assert parse_duration(text) is None


def test_a_megabyte_header_value_is_refused_before_it_is_parsed() -> None:
    said, on_lie = lies()
    value = "1s" * 500_000
    view = provider_view(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": value}, on_lie=on_lie
    )
    assert parse_duration(value) is None and view.reset == (None, None, None) and said


@pytest.mark.parametrize(
    "header",
    [
        "Wed, 21 Oct 2015 07:28:00 GMT",  # an HTTP date in the past
        "-1",
        "-0.5",
        "0",
        "1e-400",  # a float's zero
        "soon",
        "nan",
        "",
        "\x00",
    ],
)
async def test_a_429_whose_retry_after_is_past_negative_or_garbage_pauses_the_fleet_one_second(
    store: CheckpointStore, caplog: pytest.LogCaptureFixture, header: str
) -> None:
    """Counted as none (a one-second pause), and said: a WARNING and ``ignored`` on the call's bucket."""
    from agentlife._llm._messages_http import parse_retry_after

    rate = limiter(store, limits(requests_per_minute=600))
    headers = {"retry-after": header}
    with caplog.at_level(logging.WARNING, "agentlife.ratelimit"):
        assert await rate.learn(_permit(rate), 429, headers, parse_retry_after(headers))
    _, paused_until, _ = await store.rate_bucket_levels("anthropic", (600, None, None)) or ((), 0, 0)
    assert 0.5 < paused_until - time.time() <= 1.0
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "retry-after=" in said[0] and "pausing 1 s" in said[0], said
    assert rate.snapshot()["anthropic"]["ignored"] == 1


@pytest.mark.parametrize("header", ["1e400", "1" + "0" * 400, "1" + "0" * 1000])
async def test_a_retry_after_too_large_for_a_float_is_cut_to_the_bound_and_said(
    store: CheckpointStore, caplog: pytest.LogCaptureFixture, header: str
) -> None:
    from agentlife._llm._messages_http import parse_retry_after

    rate = limiter(store, limits(requests_per_minute=600))
    headers = {"Retry-After": header}
    with caplog.at_level(logging.WARNING, "agentlife.ratelimit"):
        assert await rate.learn(_permit(rate), 429, headers, parse_retry_after({"retry-after": header}))
    _, paused_until, _ = await store.rate_bucket_levels("anthropic", (600, None, None)) or ((), 0, 0)
    assert paused_until - time.time() == pytest.approx(MAX_PAUSE_SECONDS, abs=5)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "pausing 60 s" in said[0] and len(said[0]) < 200, said


async def test_what_the_provider_taught_reaches_status_without_waiting_for_a_wait(
    store: CheckpointStore,
) -> None:
    """``ignored`` and ``rate_limited`` in ``/status`` follow the WARNINGs, on the call's buckets only."""
    from agentlife._config import Settings
    from agentlife._runtime._process import ProcessShell, ShellOptions
    from agentlife.constants import Constants

    env = {"AGENTLIFE_RATE_LIMIT_RPM": "600", "AGENTLIFE_RATE_LIMIT_MODELS": "other-model rpm=5"}
    settings = Settings.from_env(env, job_id="j", agent_id="a")
    shell = ProcessShell(
        env, agent_id="a", constants=Constants(), options=ShellOptions(probes=False), on_signal=print
    )
    rate = shell.rate_limiter(store, settings)
    assert rate is not None
    await rate.acquire("other-model", 10, Waits())  # that model's bucket exists: it heard no lie
    lying = {
        "anthropic-ratelimit-requests-limit": "10",
        "anthropic-ratelimit-requests-remaining": "1000",
        "anthropic-ratelimit-input-tokens-remaining": "-5",
        "anthropic-ratelimit-output-tokens-remaining": "nan",
    }
    await rate.learn(_permit(rate), 200, lying, None)
    board = shell.board.snapshot().rate_limits or {}
    assert board["anthropic"]["ignored"] == 3 and board["anthropic/other-model"]["ignored"] == 0, board
    await rate.learn(_permit(rate), 429, {"retry-after": "0.1"}, 0.1)
    assert (shell.board.snapshot().rate_limits or {})["anthropic"]["rate_limited"] == 1


async def test_a_bucket_row_written_by_hand_is_read_within_bounds(tmp_path: Path) -> None:
    """Text, a negative level and a time in the year 10^300 in the row: draws go on, levels stay in range."""
    import sqlite3

    store = SQLiteStore(tmp_path / "agentlife.db")
    await store.open()
    try:
        caps = (600, 200_000, None)
        await store.pause_rate_bucket("acct", caps, 0)
        with sqlite3.connect(tmp_path / "agentlife.db") as conn:
            conn.execute(
                "UPDATE rate_bucket SET requests = 'lots', input_tokens = -5, updated_at = 1e300,"
                " paused_until = 'never' WHERE key = 'acct'"
            )
        grant = await store.draw_rate_capacity("acct", caps, RateDraw(need=(1, 10, 1), want=(1, 10, 0)))
        levels, paused, _ = await store.rate_bucket_levels("acct", caps) or ((), 0, 0)
    finally:
        await store.close()
    assert grant.reason in ("requests", "input_tokens") and grant.wait > 0  # read as empty, refilling
    assert all(0 <= level <= cap for level, cap in zip(levels[:2], caps[:2], strict=True))
    assert paused == 0.0


class SlowStore:
    """A store whose draws wait for the test to let them go, so calls can settle meanwhile."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store, self.go, self.drawing = store, anyio.Event(), anyio.Event()
        self.give_backs: list[tuple[float, ...]] = []

    async def draw_rate_capacity(self, key: str, caps: Any, draw: RateDraw) -> Any:
        self.give_backs.append(draw.give_back)
        self.drawing.set()
        await self.go.wait()
        return await self.store.draw_rate_capacity(key, caps, draw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


async def test_what_a_call_settles_while_another_draws_is_not_lost(store: CheckpointStore) -> None:
    """A reply's output tokens, settled while the store is being asked, go back with the next draw."""
    from agentlife._llm._protocol import Usage

    slow = SlowStore(store)
    rate = limiter(slow, RateLimits(RateLimit("acct", 600, None, 100_000)))
    slow.go.set()
    first = await rate.acquire("m", 0, Waits())
    slow.go, slow.drawing = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tg:
        rate._slices["acct"].drawn_at = -math.inf  # the slice is old: the next call draws
        tg.start_soon(rate.acquire, "m", 0, Waits())
        await slow.drawing.wait()
        await rate.release(first, Usage(output_tokens=5000))  # settled while the draw is under way
        slow.go.set()
    assert rate._slices["acct"].levels[2] < 0  # the 5000 output tokens are owed, not forgotten
    rate._slices["acct"].drawn_at = -math.inf
    slow.drawing = anyio.Event()
    await rate.acquire("m", 0, Waits())
    assert slow.give_backs[-1][2] == pytest.approx(100_000 / 60 - 5000)  # paid with the next draw
