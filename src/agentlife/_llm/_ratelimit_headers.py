"""What a provider's rate-limit headers say, read defensively: numbers bounded, lies logged and dropped.

Anthropic sends ``anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-{limit,remaining,reset}``
(the reset an RFC 3339 time); OpenAI ``x-ratelimit-{limit,remaining}-{requests,tokens}`` and
``x-ratelimit-reset-{requests,tokens}`` (a duration such as ``6m0s`` or ``20ms``). Both become a
`ProviderView`: per dimension (requests, input tokens, output tokens) what is left and the seconds until it
is full again. A remaining count above its limit, a negative or non-numeric one, a reset in the past or
unreadable is dropped (``on_lie`` hears why); a reset further than `MAX_RESET_SECONDS` is cut to it.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = [
    "MAX_RESET_SECONDS",
    "RESPONSE_SEEN",
    "ProviderView",
    "parse_duration",
    "provider_view",
    "response_seen",
]

#: Where an adapter reports a response's status and headers while a rate-limited call runs.
RESPONSE_SEEN: ContextVar[Callable[[int, Mapping[str, str]], None] | None] = ContextVar(
    "agentlife_response_seen", default=None
)


def response_seen(status: int, headers: Mapping[str, str]) -> None:
    """Called by an adapter once a response's headers arrived; one lookup when no limit is set."""
    seen = RESPONSE_SEEN.get()
    if seen is not None:
        seen(status, headers)


#: The furthest reset believed: a minute's bucket is full again within a minute; more is cut to this.
MAX_RESET_SECONDS = 60.0
#: The largest count believed (no provider's minute holds more tokens).
_MAX_COUNT = 1e12
#: (dimension index, Anthropic's name, OpenAI's name); OpenAI's tokens count input and output together,
#: which the input dimension holds (its limit is set as ``input_tpm``).
_NAMES = ((0, "requests", "requests"), (1, "input-tokens", "tokens"), (2, "output-tokens", None))
_UNIT = re.compile(r"(\d{1,12}(?:\.\d{1,9})?)(ms|h|m|s)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class ProviderView:
    """What the headers of one response said, per dimension (requests, input tokens, output tokens)."""

    remaining: tuple[float | None, float | None, float | None] = (None, None, None)
    """What is left now."""
    reset: tuple[float | None, float | None, float | None] = (None, None, None)
    """Seconds until it is full again."""

    def reset_when_exhausted(self) -> float | None:
        """The longest reset of a dimension with nothing left, if any."""
        resets = [
            r for left, r in zip(self.remaining, self.reset, strict=True) if left is not None and left < 1
        ]
        return max((r for r in resets if r is not None), default=None)


def provider_view(headers: Mapping[str, str], *, on_lie: Callable[[str], None]) -> ProviderView:
    """The rate-limit headers of a response (any case), checked; see the module."""
    fields = {str(k).lower(): str(v) for k, v in headers.items() if "ratelimit" in str(k).lower()}
    if not fields:
        return ProviderView()
    remaining: list[float | None] = [None, None, None]
    reset: list[float | None] = [None, None, None]
    for index, anthropic, openai in _NAMES:
        for name, limit, left, when, parse in (
            (
                anthropic,
                f"anthropic-ratelimit-{anthropic}-limit",
                f"anthropic-ratelimit-{anthropic}-remaining",
                f"anthropic-ratelimit-{anthropic}-reset",
                _rfc3339_seconds,
            ),
            (
                openai,
                f"x-ratelimit-limit-{openai}",
                f"x-ratelimit-remaining-{openai}",
                f"x-ratelimit-reset-{openai}",
                parse_duration,
            ),
        ):
            if name is None or left not in fields:
                continue
            value = _checked_remaining(fields[left], fields.get(limit), left, on_lie)
            if value is not None and (remaining[index] is None or value < (remaining[index] or 0)):
                remaining[index] = value
                reset[index] = _checked_reset(fields.get(when), when, parse, on_lie)
    combined = fields.get("anthropic-ratelimit-tokens-remaining")
    if combined is not None:  # the most restrictive of Anthropic's token limits, input and output together
        value = _checked_remaining(combined, fields.get("anthropic-ratelimit-tokens-limit"), "tokens", on_lie)
        if value is not None and (remaining[1] is None or value < remaining[1]):
            remaining[1] = value
            reset[1] = _checked_reset(
                fields.get("anthropic-ratelimit-tokens-reset"), "tokens-reset", _rfc3339_seconds, on_lie
            )
    return ProviderView((remaining[0], remaining[1], remaining[2]), (reset[0], reset[1], reset[2]))


def _number(raw: str | None) -> float | None:
    if raw is None or len(raw) > 40:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _checked_remaining(
    raw: str, raw_limit: str | None, name: str, on_lie: Callable[[str], None]
) -> float | None:
    value = _number(raw)
    if value is None or value < 0 or value > _MAX_COUNT:
        on_lie(f"{name}={raw[:40]!r} is not a count")
        return None
    limit = _number(raw_limit)
    if limit is not None and value > limit:
        on_lie(f"{name}={value:g} is more than its limit {limit:g}")
        return None
    return value


def _checked_reset(
    raw: str | None, name: str, parse: Callable[[str], float | None], on_lie: Callable[[str], None]
) -> float | None:
    if raw is None:
        return None
    seconds = parse(raw)
    if seconds is None or seconds <= 0:
        on_lie(f"{name}={raw[:40]!r} is not a time to come")
        return None
    return min(seconds, MAX_RESET_SECONDS)


def _rfc3339_seconds(raw: str) -> float | None:
    """Seconds from now until the RFC 3339 time ``raw`` (negative when past); None when unreadable."""
    if len(raw) > 64:
        return None
    try:
        when = dt.datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return when.timestamp() - time.time()


def parse_duration(raw: str) -> float | None:
    """OpenAI's reset duration (``1s``, ``6m0s``, ``20ms``, ``1h2m3.5s``) in seconds; None when unreadable."""
    text = raw.strip()
    if not text or len(text) > 40:
        return None
    total, at = 0.0, 0
    for match in _UNIT.finditer(text):
        if match.start() != at:
            return None
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        at = match.end()
    return total if at == len(text) else None
