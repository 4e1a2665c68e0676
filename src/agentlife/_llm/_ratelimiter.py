"""The fleet-wide rate limiter of model calls: capacity drawn from the store in slices, spent locally.

Design (see ``docs/rate-limits.md``): each process keeps, per bucket, a *slice* of capacity it drew from
the shared bucket in the store (`agentlife.stores.RateBuckets`) with one transaction, and spends it
locally: a call on an idle bucket runs no statement. A slice lives `SLICE_SECONDS`; what it left, or
overspent (a reply that used more input tokens than estimated, the output tokens, which are not known
before), goes back with the process's next draw. A call under an in-flight limit takes a leased slot in the
store for its duration: a killed process's slots come back when their lease ends.

A call that cannot have capacity now is told how long to wait (`WaitFor`, which the step turns into a
wait that is not a retry, gives way to a drain, and parks the job past ``park_after_seconds``). What the
provider says — a 429 (or a 529 with ``retry-after``), a rate-limit header with little left — pauses or
narrows the bucket in the store, so every process waits, not only the one that was refused; what it says
is bounded (`MAX_PAUSE_SECONDS`) and a lie (more left than the limit, a reset in the past) is logged and
ignored.

The store down: a call waits for it up to ``store_down_seconds``, then goes on without the fleet's limit
(two WARNINGs per outage, each once: when it begins, and when calls go on), so a store outage cannot stop
every model call for longer than that.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from agentlife._exceptions import StoreError
from agentlife._llm._ratelimit_headers import RESPONSE_SEEN, ProviderView, provider_view, response_seen
from agentlife.stores._ratebuckets import MAX_PAUSE_SECONDS, RateDraw

if TYPE_CHECKING:
    from agentlife._llm._protocol import Usage
    from agentlife._ratelimit import RateLimit, RateLimits
    from agentlife.stores._roles import RateBuckets

__all__ = [
    "MAX_PAUSE_SECONDS",
    "RESPONSE_SEEN",
    "SLICE_SECONDS",
    "BucketStats",
    "Permit",
    "RateLimiter",
    "WaitFor",
    "response_seen",
]

log = logging.getLogger("agentlife.ratelimit")

#: How long a process keeps a slice of capacity before what it left goes back (and the fraction of a
#: minute's limit it draws at a time): long enough that a busy process draws about once a second, short
#: enough that what an idle one holds is little.
SLICE_SECONDS = 1.0
#: The pause after a 429 that named no wait.
DEFAULT_PAUSE_SECONDS = 1.0
#: A rate-limit header narrows the fleet's bucket when less than this fraction of a limit is left.
LOW_FRACTION = 0.1
#: How long to wait between two looks at a store that is down.
STORE_RETRY_SECONDS = 1.0

#: ``wait(bucket, reason, seconds)``: the caller waits (or parks, or drains) before asking again.
WaitFor = Callable[[str, str, float], Awaitable[None]]


@dataclass(slots=True)
class BucketStats:
    """What one bucket's waits and lessons came to in this process (``/status`` and metrics)."""

    waits: int = 0
    """Waits for capacity begun."""
    wait_seconds: float = 0.0
    """Seconds spent waiting for capacity, all calls together."""
    waiting: int = 0
    """Calls waiting now."""
    rate_limited: int = 0
    """429 (or 529 with ``retry-after``) answers that paused the bucket."""
    narrowed: int = 0
    """Rate-limit headers that narrowed or paused the bucket."""
    ignored: int = 0
    """Provider statements ignored as impossible (more left than the limit, garbage)."""


@dataclass(slots=True)
class _Slice:
    """The capacity this process drew from one bucket, spent locally."""

    limit: RateLimit
    levels: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    drawn_at: float = -math.inf
    #: Until when the bucket is known to have no room (the store said so): this process's other calls
    #: wait without asking the store again, and why.
    blocked_until: float = 0.0
    blocked_reason: str = "paused"
    lock: anyio.Lock = field(default_factory=anyio.Lock)

    @property
    def caps(self) -> tuple[int | None, int | None, int | None]:
        return self.limit.rates

    def keep(self, amounts: tuple[float, ...]) -> None:
        """Add ``amounts`` to the slice, on top of what calls settled while the store was being asked."""
        self.levels = [level + amount for level, amount in zip(self.levels, amounts, strict=True)]

    def leftovers(self) -> tuple[float, float, float]:
        """What goes back to the bucket (negative: overspent), and the slice emptied."""
        out = tuple(
            level if cap is not None else 0.0 for level, cap in zip(self.levels, self.caps, strict=True)
        )
        self.levels = [0.0, 0.0, 0.0]
        return out  # type: ignore[return-value]


@dataclass(slots=True)
class Permit:
    """The capacity one call holds: what it took from each bucket and its in-flight slots."""

    model: str
    estimate: float
    parts: list[tuple[_Slice, str | None]] = field(default_factory=list)


class RateLimiter:
    """One process's limiter over the store's buckets; shared by every job a worker runs.

    Args:
        store: the store's buckets.
        limits: the configured limits.
        slot_lease_seconds: how long an in-flight slot is kept if its process dies (longer than any call).
        store_down_seconds: how long a call waits for a store that is down before it goes on unlimited.
        clock: the monotonic clock (tests).
    """

    def __init__(
        self,
        store: RateBuckets,
        limits: RateLimits,
        *,
        slot_lease_seconds: float,
        store_down_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store, self._limits = store, limits
        self._slot_lease, self._down_limit = slot_lease_seconds, store_down_seconds
        self._clock = clock
        self._slices: dict[str, _Slice] = {}
        self._down_since: float | None = None
        self.stats: dict[str, BucketStats] = {}
        #: Told of each wait as it begins (seconds None) and ends (the seconds waited): status, metrics.
        self.observe: Callable[[str, str, float | None], None] | None = None
        #: Told when what the provider taught changed the counters without a wait (``/status``).
        self.changed: Callable[[], None] | None = None

    def snapshot(self) -> dict[str, dict[str, float | int]]:
        """Per bucket: waits, seconds waited, calls waiting now, what the provider taught (``/status``)."""
        return {
            key: {
                "waits": s.waits,
                "wait_seconds": round(s.wait_seconds, 3),
                "waiting": s.waiting,
                "rate_limited": s.rate_limited,
                "narrowed": s.narrowed,
                "ignored": s.ignored,
            }
            for key, s in self.stats.items()
        }

    def _slice(self, limit: RateLimit) -> _Slice:
        found = self._slices.get(limit.key)
        if found is None:
            found = self._slices[limit.key] = _Slice(limit)
            self.stats[limit.key] = BucketStats()
        return found

    # -- taking capacity ----------------------------------------------------------------------------------

    async def acquire(self, model: str, estimate: float, wait: WaitFor) -> Permit:
        """Capacity for one call to ``model`` of about ``estimate`` input tokens, waiting for it if needed.

        ``wait`` is awaited for each wait; it may raise (a park, a drain), and then nothing is held.
        """
        estimate = max(0.0, float(estimate))
        while True:
            permit = Permit(model, estimate)
            delay, key, reason = 0.0, "", ""
            for limit in self._limits.buckets(model):
                piece = self._slice(limit)
                delay, reason, slot = await self._take(piece, estimate)
                if delay > 0:
                    key = limit.key
                    break
                permit.parts.append((piece, slot))
            if delay <= 0:
                return permit
            await self.release(permit, None, refund=True)
            await self._wait(key, reason, delay, wait)

    async def _wait(self, key: str, reason: str, delay: float, wait: WaitFor) -> None:
        stats = self.stats[key]
        stats.waits += 1
        stats.waiting += 1
        began = self._clock()
        if self.observe is not None:
            self.observe(key, reason, None)
        try:
            await wait(key, reason, delay)
        finally:
            stats.waiting -= 1
            stats.wait_seconds += self._clock() - began
            if self.observe is not None:
                self.observe(key, reason, self._clock() - began)

    async def _take(self, piece: _Slice, estimate: float) -> tuple[float, str, str | None]:
        """(seconds to wait, why, the slot taken) for one bucket: from the local slice when it can."""
        need = _need(piece.caps, estimate)
        if piece.limit.in_flight is None and self._take_locally(piece, need):
            return 0.0, "", None
        async with piece.lock:  # one draw at a time per bucket: the others use what it brought
            now = self._clock()
            if piece.blocked_until > now:
                return piece.blocked_until - now, piece.blocked_reason, None
            if piece.limit.in_flight is None and self._take_locally(piece, need):
                return 0.0, "", None
            return await self._draw(piece, need)

    def _take_locally(self, piece: _Slice, need: tuple[float, float, float]) -> bool:
        now = self._clock()
        if piece.blocked_until > now or now - piece.drawn_at > SLICE_SECONDS:
            return False
        levels = piece.levels
        for i, cap in enumerate(piece.caps):
            if cap is not None and levels[i] < need[i] - 1e-9:
                return False
        levels[0] -= need[0]
        levels[1] -= need[1]  # output tokens are paid when the reply tells how many
        return True

    async def _draw(self, piece: _Slice, need: tuple[float, float, float]) -> tuple[float, str, str | None]:
        caps, limit = piece.caps, piece.limit
        want = tuple(
            0.0 if cap is None else max(need[i], cap * SLICE_SECONDS / 60.0) for i, cap in enumerate(caps)
        )
        slot = uuid.uuid4().hex if limit.in_flight is not None else None
        give_back = piece.leftovers()
        draw = RateDraw(
            need=need,
            want=want,  # type: ignore[arg-type]
            give_back=give_back,
            slot=slot,
            in_flight=limit.in_flight,
            slot_until=time.time() + self._slot_lease,
        )
        try:
            grant = await self._store.draw_rate_capacity(limit.key, caps, draw)
        except StoreError as exc:
            piece.keep(give_back)  # for the next draw
            return self._store_down(limit.key, exc)
        self._store_up()
        if grant.wait > 0:
            if grant.reason != "in_flight":  # a slot may end any moment; refills and pauses have a time
                piece.blocked_until, piece.blocked_reason = self._clock() + grant.wait, grant.reason
            return grant.wait, grant.reason, None
        piece.keep(tuple(grant.granted[i] - need[i] if i < 2 else grant.granted[i] for i in range(3)))
        piece.drawn_at = self._clock()
        return 0.0, "", slot

    def _store_down(self, key: str, exc: StoreError) -> tuple[float, str, str | None]:
        """Wait for the store up to ``store_down_seconds``, then let calls go on without the fleet's limit."""
        now = self._clock()
        if self._down_since is None:
            self._down_since = now
            log.warning(
                "rate limit %s: the store is unavailable (%s); calls wait for it", key, type(exc).__name__
            )
        if now - self._down_since < self._down_limit:
            return min(STORE_RETRY_SECONDS, self._down_limit - (now - self._down_since)), "store", None
        if not math.isinf(self._down_since):
            log.warning(
                "rate limit %s: the store has been unavailable for %.0f s; calls go on without the fleet's"
                " limit until it is back",
                key,
                now - self._down_since,
            )
            self._down_since = -math.inf  # logged once per outage
        return 0.0, "", None

    def _store_up(self) -> None:
        if self._down_since is not None:
            log.info("rate limits: the store is reachable again")
            self._down_since = None

    # -- giving back and learning -------------------------------------------------------------------------

    async def release(self, permit: Permit, usage: Usage | None, *, refund: bool = False) -> None:
        """Settle ``permit``: the reply's real usage (None: unknown), or all of it back when ``refund``.

        A call that failed after it was sent keeps its estimate spent (the provider may have counted it).
        """
        parts, permit.parts = permit.parts, []
        for piece, slot in parts:
            if refund:
                piece.levels[0] += 1.0
                piece.levels[1] += _need(piece.caps, permit.estimate)[1]
            elif usage is not None:
                # What the provider counts against input tokens a minute: cache reads do not count.
                used = max(0, usage.input_tokens) + max(0, usage.cache_creation_input_tokens)
                piece.levels[1] += _need(piece.caps, permit.estimate)[1] - used
                piece.levels[2] -= max(0.0, float(usage.output_tokens))
            if slot is not None:
                await self._end_slot(piece, slot)

    async def _end_slot(self, piece: _Slice, slot: str) -> None:
        """The slot back, with what the slice left; shielded: a cancelled call still gives its slot back."""
        give_back = piece.leftovers()
        with anyio.CancelScope(shield=True), anyio.move_on_after(STORE_RETRY_SECONDS * 5):
            try:
                await self._store.return_rate_capacity(piece.limit.key, piece.caps, give_back, slot)
                return
            except StoreError as exc:
                log.warning(
                    "rate limit %s: slot not returned (%s); its lease ends it",
                    piece.limit.key,
                    type(exc).__name__,
                )
        piece.keep(give_back)

    async def learn(
        self, permit: Permit, status: int | None, headers: Mapping[str, str] | None, retry_after: float | None
    ) -> bool:
        """Tell the fleet what a response said; True when it was a rate limit the call should wait out.

        A 429, or a 529 with ``retry-after``, pauses every bucket of the call for the wait it named
        (bounded, `MAX_PAUSE_SECONDS`; `DEFAULT_PAUSE_SECONDS` when it named none); a rate-limit header
        with less than `LOW_FRACTION` of a limit left narrows the bucket to it.
        """
        lies: list[str] = []
        view = provider_view(headers or {}, on_lie=lies.append)
        limited = status == 429 or (status == 529 and retry_after is not None)
        buckets = [self._slice(b) for b in self._limits.buckets(permit.model)]
        pause = self._bounded_pause(retry_after, headers or {}, lies) if limited else 0.0
        taught = bool(lies)
        for piece in buckets:
            stats = self.stats[piece.limit.key]
            stats.ignored += len(lies)
            if limited:
                await self._pause(piece, pause, (None, None, None))
                stats.rate_limited += 1
            elif await self._narrow(piece, view):
                taught = True
        for what in lies:
            log.warning("ignored a rate-limit header: %s", what)
        if (limited or taught) and self.changed is not None:
            self.changed()
        return limited

    def _bounded_pause(self, retry_after: float | None, headers: Mapping[str, str], lies: list[str]) -> float:
        """The pause a 429 imposes: what it asked, within (0, `MAX_PAUSE_SECONDS`].

        No ``retry-after``, or one of 0 (a date in the past, or a server that says "now" while refusing):
        `DEFAULT_PAUSE_SECONDS`, so a refusing server is not asked again at once, eight times in a row; a
        ``retry-after`` sent but not a time to come (``-1``, ``soon``, ``nan``) is one of ``lies``.
        """
        said = _retry_after_said(headers)
        if retry_after is None or retry_after <= 0:
            if said:
                lies.append(f"{said} is not a time to come; pausing {DEFAULT_PAUSE_SECONDS:g} s")
            return DEFAULT_PAUSE_SECONDS
        if retry_after > MAX_PAUSE_SECONDS:
            log.warning(
                "a provider asked for a pause of %s; pausing %.0f s",
                said or f"{retry_after:.6g} s",
                MAX_PAUSE_SECONDS,
            )
            return MAX_PAUSE_SECONDS
        return retry_after

    async def _narrow(self, piece: _Slice, view: ProviderView) -> bool:
        """Levels down to what the provider says is left (True when it was little); the refill then paces.

        The providers' ``reset`` is when a bucket is *full* again, not when it has room for one more call
        (they refill continuously): it is read and checked, never waited for.
        """
        remaining: list[float | None] = [None, None, None]
        for i, cap in enumerate(piece.caps):
            left = view.remaining[i]
            if cap is not None and left is not None and left < cap * LOW_FRACTION:
                remaining[i] = left
        if remaining == [None, None, None]:
            return False
        self.stats[piece.limit.key].narrowed += 1
        await self._pause(piece, 0.0, tuple(remaining))
        return True

    async def _pause(self, piece: _Slice, seconds: float, remaining: tuple[float | None, ...]) -> None:
        if seconds > 0 and self._clock() + seconds > piece.blocked_until:
            piece.blocked_until, piece.blocked_reason = self._clock() + seconds, "paused"
        for i, left in enumerate(remaining):
            if left is not None:
                piece.levels[i] = min(piece.levels[i], left)
        try:
            await self._store.pause_rate_bucket(piece.limit.key, piece.caps, time.time() + seconds, remaining)
        except StoreError as exc:
            log.warning("rate limit %s: could not tell the fleet (%s)", piece.limit.key, type(exc).__name__)


def _retry_after_said(headers: Mapping[str, str]) -> str:
    """The ``retry-after`` headers a response carried, as sent (cut), for a WARNING; empty when none."""
    said = [
        f"{str(k).lower()}={str(v)[:40]!r}"
        for k, v in headers.items()
        if str(k).lower().startswith("retry-after")
    ]
    return ", ".join(said)


def _need(caps: tuple[int | None, int | None, int | None], estimate: float) -> tuple[float, float, float]:
    """One request, the input estimate (never more than a whole minute's limit), one output token."""
    cap_in = caps[1]
    return (1.0, estimate if cap_in is None else min(estimate, float(cap_in)), 1.0)
