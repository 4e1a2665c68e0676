"""Fleet-wide rate limits of a provider account, as configured: what each bucket allows per minute.

A provider limits an account (an API key's organisation) per minute: requests, input tokens, output tokens
(Anthropic's RPM / ITPM / OTPM, OpenAI's RPM / TPM). Every process that shares a job store and names the
same account draws on one bucket per limit set, kept in the store (`agentlife.stores` ``rate_bucket``).

Configuration, read once at boot by `rate_limits_from_env` (a bad value is a one-line `ConfigError`, exit 2):

* ``AGENTLIFE_RATE_LIMIT_RPM``, ``AGENTLIFE_RATE_LIMIT_INPUT_TPM``, ``AGENTLIFE_RATE_LIMIT_OUTPUT_TPM``,
  ``AGENTLIFE_RATE_LIMIT_IN_FLIGHT``: the account's limits (each optional; none set: no limiter at all);
* ``AGENTLIFE_RATE_LIMIT_MODELS``: limits of single models, ``MODEL rpm=50 input_tpm=30000; MODEL2 ...``
  (keys ``rpm``, ``input_tpm``, ``output_tpm``, ``in_flight``), each a bucket of its own on top of the
  account's;
* ``AGENTLIFE_RATE_LIMIT_ACCOUNT``: the account's name in the store (default: the provider's name); give
  processes that use different API keys different names.

Any ``AGENTLIFE_RATE_LIMIT_*`` set but blank, or with a name not in that list, is refused the same way: a
Helm value rendered empty, or a mistyped name, would otherwise turn a limit off for the whole fleet.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from agentlife._exceptions import ConfigError

__all__ = [
    "MAX_LIMIT",
    "RateLimit",
    "RateLimits",
    "rate_limits_from_env",
]

#: The largest limit accepted: a billion per minute is past any provider's tier; more is a typo.
MAX_LIMIT = 1_000_000_000
_FIELDS = {
    "rpm": "requests_per_minute",
    "input_tpm": "input_tokens_per_minute",
    "output_tpm": "output_tokens_per_minute",
    "in_flight": "in_flight",
}
_ACCOUNT_VARIABLES = {
    "AGENTLIFE_RATE_LIMIT_RPM": "requests_per_minute",
    "AGENTLIFE_RATE_LIMIT_INPUT_TPM": "input_tokens_per_minute",
    "AGENTLIFE_RATE_LIMIT_OUTPUT_TPM": "output_tokens_per_minute",
    "AGENTLIFE_RATE_LIMIT_IN_FLIGHT": "in_flight",
}
_PREFIX = "AGENTLIFE_RATE_LIMIT_"
#: Every variable of the family (the store-down wait is read with the constants, and checked here too).
_KNOWN_VARIABLES = (
    *_ACCOUNT_VARIABLES,
    "AGENTLIFE_RATE_LIMIT_MODELS",
    "AGENTLIFE_RATE_LIMIT_ACCOUNT",
    "AGENTLIFE_RATE_LIMIT_STORE_DOWN_SECONDS",
)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@-]{0,99}")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """The limits of one bucket: the account's, or one model's (None: not limited in that dimension)."""

    key: str
    """The bucket's name in the store: ``account`` or ``account/model``."""
    requests_per_minute: int | None = None
    """Requests a minute (RPM)."""
    input_tokens_per_minute: int | None = None
    """Input tokens a minute (ITPM; OpenAI's TPM counts input and output: set it here)."""
    output_tokens_per_minute: int | None = None
    """Output tokens a minute (OTPM)."""
    in_flight: int | None = None
    """Calls under way at once, fleet-wide."""

    @property
    def rates(self) -> tuple[int | None, int | None, int | None]:
        """(requests, input tokens, output tokens) per minute."""
        return (self.requests_per_minute, self.input_tokens_per_minute, self.output_tokens_per_minute)


@dataclass(frozen=True, slots=True)
class RateLimits:
    """Every bucket a process's model calls draw on: the account's and those of single models."""

    account: RateLimit | None = None
    """The account's limits, for every call (None: the account is not limited)."""
    models: Mapping[str, RateLimit] | None = None
    """Model name -> that model's own limits."""

    def buckets(self, model: str) -> tuple[RateLimit, ...]:
        """The buckets a call to ``model`` draws on, the account's first."""
        own = self.models.get(model) if self.models else None
        return tuple(limit for limit in (self.account, own) if limit is not None)


def rate_limits_from_env(env: Mapping[str, str], provider: str) -> RateLimits | None:
    """The configured limits, or None when none is set (then no call pays anything for them).

    Raises:
        ConfigError: a value that is not a whole number from 1 to `MAX_LIMIT`, a malformed model list, an
            ``AGENTLIFE_RATE_LIMIT_*`` variable set but blank or of a name not known, naming the variable.
    """
    _check_names(env)
    account = _account_name(env, provider)
    values = {attr: _limit(name, env[name]) for name, attr in _ACCOUNT_VARIABLES.items() if name in env}
    account_limit = RateLimit(account, **values) if values else None
    models = _models(env.get("AGENTLIFE_RATE_LIMIT_MODELS", ""), account)
    if account_limit is None and not models:
        return None
    return RateLimits(account_limit, models or None)


def _check_names(env: Mapping[str, str]) -> None:
    """Refuse a variable of the family that is blank or unknown: either would turn a limit off unsaid."""
    for name in sorted(k for k in env if k.startswith(_PREFIX)):
        if name not in _KNOWN_VARIABLES:
            import difflib  # only on the way to an error

            close = difflib.get_close_matches(name, _KNOWN_VARIABLES, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(
                f"{name[:80]} is not a rate-limit variable ({hint}known: "
                f"{', '.join(v.removeprefix(_PREFIX) for v in _KNOWN_VARIABLES)} after {_PREFIX})"
            )
        if not env[name].strip():
            raise ConfigError(
                f"{name} is set but blank (a value rendered empty?): give it a value, or leave it unset for "
                "no limit"
            )


def _account_name(env: Mapping[str, str], provider: str) -> str:
    raw = env.get("AGENTLIFE_RATE_LIMIT_ACCOUNT", "").strip()
    if not raw:
        return provider
    if not _NAME.fullmatch(raw):
        raise ConfigError(
            f"AGENTLIFE_RATE_LIMIT_ACCOUNT={raw[:40]!r} is not a name: letters, digits and ._:/@- "
            "(at most 100)"
        )
    return raw


def _limit(name: str, raw: str) -> int:
    """A limit: a whole number from 1 to `MAX_LIMIT` (``1e3`` and ``600.0`` accepted when whole)."""
    text = raw.strip()
    try:
        # ASCII only: float() also reads other scripts' digits ("\u0665" is 5), which no console shows.
        value = float(text) if len(text) <= 40 and text.isascii() else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value != int(value):
        raise ConfigError(f"{name}={raw[:40]!r} is not a whole number (a limit per minute, or in flight)")
    if not 1 <= value <= MAX_LIMIT:
        raise ConfigError(
            f"{name}={raw[:40]!r} must be from 1 to {MAX_LIMIT} (leave it unset for no limit; 0 would stop "
            "every call)"
        )
    return int(value)


def _models(raw: str, account: str) -> dict[str, RateLimit]:
    """``MODEL rpm=50 input_tpm=30000; MODEL2 ...`` as model -> its bucket."""
    models: dict[str, RateLimit] = {}
    what = "AGENTLIFE_RATE_LIMIT_MODELS"
    for entry in raw.split(";"):
        words = entry.split()
        if not words:
            continue
        model, settings = words[0], words[1:]
        if not _NAME.fullmatch(model) or "=" in model:
            raise ConfigError(
                f"{what}: {model[:40]!r} is not a model name (write: MODEL rpm=50 input_tpm=...)"
            )
        if model in models:
            raise ConfigError(f"{what}: model {model!r} is listed twice")
        values: dict[str, int] = {}
        for setting in settings:
            key, sep, value = setting.partition("=")
            if not sep or key not in _FIELDS:
                keys = ", ".join(k + "=N" for k in _FIELDS)
                raise ConfigError(f"{what}: {setting[:40]!r} for {model} is not one of {keys}")
            if _FIELDS[key] in values:
                raise ConfigError(f"{what}: {key} is given twice for {model} (which one is meant?)")
            values[_FIELDS[key]] = _limit(f"{what} {model} {key}", value)
        if not values:
            raise ConfigError(f"{what}: model {model!r} has no limit (write: {model} rpm=50 ...)")
        models[model] = RateLimit(f"{account}/{model}", **values)
    return models
