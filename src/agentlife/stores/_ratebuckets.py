"""Fleet-wide rate-limit buckets: capacity a process draws in slices, and the slots of calls in flight.

One ``rate_bucket`` row per configured bucket (an account, or an account's model) holds three token
buckets — requests, input tokens, output tokens — as their levels at ``updated_at``; each refills
continuously at its limit per minute up to that limit, like the providers' own. A process draws a slice
(`draw_rate_capacity`) and spends it locally, so a call on an idle bucket costs no statement; what it did
not spend, or spent beyond its estimate, goes back with its next draw. A call under an in-flight limit
holds a ``rate_slot`` row until it ends (`return_rate_capacity`), or until the slot's lease runs out when
its process was killed: a slot is never lost for longer than its lease.

What a provider says (a 429's ``retry-after``, a rate-limit header's remaining count) pauses or narrows
the bucket for every process (`pause_rate_bucket`). Levels stay within ``[0, limit]`` whatever is given
back, a clock that went backwards refills nothing, and a pause read from the row ends at most
`MAX_PAUSE_SECONDS` after the reader's now (a row written by a host whose clock runs ahead, or by hand,
cannot park the fleet for longer).

Each operation is one transaction (``FOR UPDATE`` on PostgreSQL, SQLite's write lock) of a few statements;
the hot path does not run one (see ``docs/rate-limits.md``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentlife.stores._dialect import Tx

__all__ = [
    "IN_FLIGHT_POLL_SECONDS",
    "MAX_PAUSE_SECONDS",
    "RateDraw",
    "RateGrant",
    "draw_rate_capacity",
    "pause_rate_bucket",
    "rate_bucket_levels",
    "refill",
    "return_rate_capacity",
]

log = logging.getLogger("agentlife.ratelimit")

#: The longest pause a bucket holds: what one answer of a provider may impose (a ``retry-after`` of a
#: year is a lie or a bug), and the furthest a ``paused_until`` read from the row is believed.
MAX_PAUSE_SECONDS = 60.0
#: How far past that bound a row's pause may be before it is said (a clock a little ahead is no news).
_PAUSE_SLACK_SECONDS = 1.0
#: How often a call waiting for an in-flight slot asks again: slots end in other processes, unseen.
IN_FLIGHT_POLL_SECONDS = 0.2
#: Caps per dimension: (requests, input tokens, output tokens) per minute, None where not limited.
Caps = tuple[int | None, int | None, int | None]


@dataclass(frozen=True, slots=True)
class RateDraw:
    """What a process asks of a bucket.

    Attributes:
        need: the least of each dimension worth granting (one request, the call's input estimate capped
            at the limit, one output token); below it the caller waits.
        want: what to take when there is more (a slice a process spends locally), at least ``need``.
        give_back: what the previous slice left (positive) or overspent (negative), per dimension.
        slot: the id of an in-flight slot to take with the capacity (None: no in-flight limit).
        in_flight: the bucket's in-flight limit.
        slot_until: when the slot's lease ends if never returned (unix seconds).
    """

    need: tuple[float, float, float]
    want: tuple[float, float, float]
    give_back: tuple[float, float, float] = (0.0, 0.0, 0.0)
    slot: str | None = None
    in_flight: int | None = None
    slot_until: float = 0.0


@dataclass(frozen=True, slots=True)
class RateGrant:
    """What a draw got: the capacity granted, or how long to wait before asking again."""

    granted: tuple[float, float, float]
    """Capacity per dimension (zeros when waiting)."""
    wait: float
    """Seconds before the need can be met (0: granted)."""
    reason: str = ""
    """Why it waits: ``paused``, ``requests``, ``input_tokens``, ``output_tokens`` or ``in_flight``."""


_DIMENSIONS = ("requests", "input_tokens", "output_tokens")


def refill(level: float, cap: int | None, elapsed: float) -> float:
    """``level`` after ``elapsed`` seconds of refilling at ``cap`` a minute, within ``[0, cap]``."""
    if cap is None:
        return math.inf
    if not math.isfinite(level):
        level = 0.0
    return min(float(cap), max(0.0, level) + cap * max(0.0, elapsed) / 60.0)


async def _levels(tx: Tx, key: str, caps: Caps) -> tuple[list[float], float]:
    """The bucket's levels now and its pause end, its row locked (made full when it did not exist)."""
    now = tx.now
    await tx.execute(tx.sql.rate_insert_bucket, key=key, at=now, **_named(caps))
    row = await tx.fetchrow(tx.sql.rate_lock_bucket, key=key)
    assert row is not None  # inserted above, and a bucket row is never deleted
    updated = _number(row[3], now)
    # A clock that went backwards (another host's, or this one's) refills nothing rather than negative.
    elapsed = now - updated if now > updated else 0.0
    levels = [refill(_number(row[i], 0.0), caps[i], elapsed) for i in range(3)]
    return levels, _bounded_pause(key, _number(row[4], 0.0), now, warn=True)


def _bounded_pause(key: str, paused_until: float, now: float, *, warn: bool) -> float:
    """The row's pause end, at most `MAX_PAUSE_SECONDS` past ``now``.

    A row written by a host whose clock runs a day ahead (its "now + pause"), or by hand, would otherwise
    park every job of the fleet for as long as it says. The bounded value is written back with the
    transaction, so the WARNING is said once, by the process that repaired the row.
    """
    furthest = now + MAX_PAUSE_SECONDS
    if paused_until <= furthest:
        return paused_until
    if warn and paused_until > furthest + _PAUSE_SLACK_SECONDS:
        log.warning(
            "rate limit %s: the store's pause ends %.3g s from now (a clock ahead, or the row written by"
            " hand); pausing %.0f s",
            key,
            paused_until - now,
            MAX_PAUSE_SECONDS,
        )
    return furthest


def _number(value: object, default: float) -> float:
    """A stored number, ``default`` for one written badly (NULL, NaN, text)."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return default


def _named(levels: Sequence[float | int | None]) -> dict[str, float | None]:
    return {
        name: None if level is None or not math.isfinite(level) else float(level)
        for name, level in zip(_DIMENSIONS, levels, strict=True)
    }


async def _write(tx: Tx, key: str, levels: Sequence[float], paused_until: float) -> None:
    await tx.execute(
        tx.sql.rate_write_bucket, key=key, paused_until=paused_until, at=tx.now, **_named(levels)
    )


def _give_back(levels: list[float], caps: Caps, give_back: Sequence[float]) -> None:
    for i, amount in enumerate(give_back):
        cap = caps[i]
        if cap is not None and math.isfinite(amount):
            levels[i] = min(float(cap), max(0.0, levels[i] + amount))


async def draw_rate_capacity(tx: Tx, key: str, caps: Caps, draw: RateDraw) -> RateGrant:
    """Take ``draw.want`` (at least ``draw.need``) from bucket ``key``, or say how long to wait.

    ``draw.give_back`` is applied first, whatever the outcome. A paused bucket grants nothing until its
    pause ends; an in-flight limit counts the live slots (expired ones are deleted: their holders died).
    """
    async with tx.atomic():
        levels, paused_until = await _levels(tx, key, caps)
        _give_back(levels, caps, draw.give_back)
        wait, reason = _wait_for(levels, caps, draw.need, paused_until - tx.now)
        if wait <= 0 and draw.slot is not None and draw.in_flight is not None:
            await tx.execute(tx.sql.rate_expire_slots, key=key, at=tx.now)
            if (await tx.fetchval(tx.sql.rate_count_slots, key=key) or 0) >= draw.in_flight:
                wait, reason = IN_FLIGHT_POLL_SECONDS, "in_flight"
        granted = (0.0, 0.0, 0.0)
        if wait <= 0:
            granted = tuple(  # type: ignore[assignment]
                min(levels[i], max(draw.need[i], draw.want[i])) if caps[i] is not None else draw.want[i]
                for i in range(3)
            )
            for i in range(3):
                if caps[i] is not None:
                    levels[i] = max(0.0, levels[i] - granted[i])
            if draw.slot is not None and draw.in_flight is not None:
                await tx.execute(tx.sql.rate_take_slot, id=draw.slot, key=key, until=draw.slot_until)
        await _write(tx, key, levels, paused_until)
        return RateGrant(granted, max(0.0, wait), reason if wait > 0 else "")


def _wait_for(levels: Sequence[float], caps: Caps, need: Sequence[float], paused: float) -> tuple[float, str]:
    """Seconds until ``need`` fits (refilling at each cap), and the dimension that decides it."""
    if paused > 0:
        return paused, "paused"
    wait, reason = 0.0, ""
    for i, cap in enumerate(caps):
        if cap is None:
            continue
        short = min(need[i], float(cap)) - levels[i]
        if short > 1e-9:
            seconds = short * 60.0 / cap
            if seconds > wait:
                wait, reason = seconds, _DIMENSIONS[i]
    return wait, reason


async def return_rate_capacity(
    tx: Tx, key: str, caps: Caps, give_back: Sequence[float], slot: str | None = None
) -> None:
    """Give back what a slice left (or take what it overspent) and end in-flight slot ``slot``."""
    async with tx.atomic():
        levels, paused_until = await _levels(tx, key, caps)
        _give_back(levels, caps, give_back)
        await _write(tx, key, levels, paused_until)
        if slot is not None:
            await tx.execute(tx.sql.rate_end_slot, id=slot)


async def pause_rate_bucket(
    tx: Tx, key: str, caps: Caps, until: float, remaining: Sequence[float | None] = (None, None, None)
) -> None:
    """What a provider said, for every process: no capacity before ``until``, at most ``remaining`` now.

    ``until`` and ``remaining`` are bounded by the caller (`agentlife._llm._ratelimiter`), and ``until``
    again here (at most `MAX_PAUSE_SECONDS` from now); a pause never shortens a longer one already set,
    and a remaining count never raises a level.
    """
    async with tx.atomic():
        levels, paused_until = await _levels(tx, key, caps)
        for i, left in enumerate(remaining):
            if left is not None and caps[i] is not None and math.isfinite(left):
                levels[i] = min(levels[i], max(0.0, left))
        await _write(tx, key, levels, max(paused_until, min(until, tx.now + MAX_PAUSE_SECONDS)))


async def rate_bucket_levels(tx: Tx, key: str, caps: Caps) -> tuple[tuple[float, ...], float, int] | None:
    """(levels refilled to now, pause end, live slots) of bucket ``key``; None when it has no row.

    Reads only: what ``/status`` and the tests look at.
    """
    row = await tx.fetchrow(tx.sql.rate_get_bucket, key=key)
    if row is None:
        return None
    now = tx.now
    updated = _number(row[3], now)
    elapsed = now - updated if now > updated else 0.0
    levels = tuple(refill(_number(row[i], 0.0), caps[i], elapsed) for i in range(3))
    paused_until = _bounded_pause(key, _number(row[4], 0.0), now, warn=False)
    slots = await tx.fetchval(tx.sql.rate_live_slots, key=key, at=now) or 0
    return levels, paused_until, int(slots)
