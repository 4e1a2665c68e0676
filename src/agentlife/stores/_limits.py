"""Concurrency keys, priority and the running limits a worker's claim enforces.

A job may carry a ``concurrency_key`` (any short text: a tenant, a repository, a customer) and a
``priority`` (an integer; higher is claimed first). A worker reads its limits from the environment at boot
(`claim_limits_from_env`): the most RUNNING jobs per key (``AGENTLIFE_CONCURRENCY_KEY_LIMIT``, with per-key
overrides in ``AGENTLIFE_CONCURRENCY_KEY_LIMITS``) and per agent (``AGENTLIFE_AGENT_RUNNING_LIMIT``). The
claim statement itself skips the rows whose key, or whose agent, is at its limit (`agentlife.stores._claims`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from agentlife._exceptions import ConfigError, StoreUnavailable

if TYPE_CHECKING:
    from agentlife.stores._dialect import Tx

__all__ = [
    "CONCURRENCY_KEY_MAX_CHARS",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "RUNNING_LIMIT_MAX",
    "ClaimLimits",
    "check_key_columns",
    "claim_limits_from_env",
    "parse_priority",
    "validate_concurrency_key",
    "validate_priority",
]

#: The longest concurrency key, in characters.
CONCURRENCY_KEY_MAX_CHARS = 200
#: The range of a job's priority (higher is claimed first; the default is 0).
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000
#: The largest running limit a worker accepts (a per-key slot is a number up to the limit).
RUNNING_LIMIT_MAX = 100_000

#: A whole number as a person writes it: ASCII digits only (not a superscript, not another script's), one
#: sign, short enough to parse fast.
_WHOLE = re.compile(r"[+-]?[0-9]{1,12}")
#: Unicode categories a key may not hold: control, format, surrogate, line and paragraph separator.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

KEY_LIMIT_ENV = "AGENTLIFE_CONCURRENCY_KEY_LIMIT"
KEY_LIMITS_ENV = "AGENTLIFE_CONCURRENCY_KEY_LIMITS"
AGENT_LIMIT_ENV = "AGENTLIFE_AGENT_RUNNING_LIMIT"


@dataclass(frozen=True, slots=True)
class ClaimLimits:
    """The running limits a worker's claim enforces; empty (the default) enforces none and costs nothing.

    A worker reads them from its environment at boot; pass them to `WorkQueue.claim_next` (``limits=``)
    to claim as a worker does.

    Example:
        >>> ClaimLimits(key_default=2, key_limits={"tenant-acme": 5}).active
        True
    """

    key_default: int | None = None
    """The most RUNNING jobs of one concurrency key, for keys without an override (None: unlimited)."""
    key_limits: Mapping[str, int] = field(default_factory=dict)
    """Per-key overrides of ``key_default``."""
    agent: int | None = None
    """The most RUNNING jobs of the worker's agent, over every worker of the store (None: unlimited)."""

    @property
    def active(self) -> bool:
        """Whether any limit is set (else the claim is the plain one)."""
        return self.key_default is not None or bool(self.key_limits) or self.agent is not None

    def key_limits_json(self) -> str:
        """The per-key overrides as the JSON object the claim statement reads."""
        return orjson.dumps(dict(self.key_limits)).decode()


def validate_concurrency_key(key: object, what: str = "--concurrency-key") -> str | None:
    """``key`` if it is a usable concurrency key (or None), else `ConfigError` naming ``what``.

    A key is text of 1 to `CONCURRENCY_KEY_MAX_CHARS` characters, not only spaces, without control or
    format characters (a terminal escape, a bidirectional override, a zero-width space), line or paragraph
    separators, or lone surrogates: it is printed by ``job show`` and the console, and stored as text.
    """
    if key is None:
        return None
    if not isinstance(key, str):
        raise ConfigError(f"{what} must be a string, got {type(key).__name__}")
    if not key.strip():
        raise ConfigError(f"{what} must not be empty")
    if len(key) > CONCURRENCY_KEY_MAX_CHARS:
        raise ConfigError(f"{what} is {len(key)} characters long: at most {CONCURRENCY_KEY_MAX_CHARS}")
    for char in key:
        if unicodedata.category(char) in _REFUSED_CATEGORIES:
            raise ConfigError(f"{what} holds the control character U+{ord(char):04X}")
    return key


def validate_priority(priority: object, what: str = "--priority") -> int:
    """``priority`` as an int within [`PRIORITY_MIN`, `PRIORITY_MAX`], else `ConfigError` naming ``what``."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ConfigError(f"{what} must be a whole number, got {type(priority).__name__}")
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ConfigError(f"{what}={_shown(priority)} is out of range: {PRIORITY_MIN} to {PRIORITY_MAX}")
    return priority


def parse_priority(text: str, what: str = "--priority") -> int:
    """A priority given as text (the command line), checked by `validate_priority`."""
    stripped = text.strip()
    if not _WHOLE.fullmatch(stripped):
        raise ConfigError(f"{what}={text[:24]!r} is not a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}")
    return validate_priority(int(stripped), what)


def check_key_columns(tx: Tx, concurrency_key: str | None, priority: int) -> None:
    """Refuse a key or a priority the job table cannot hold yet, rather than drop it silently."""
    if not tx.sql.keys and (concurrency_key is not None or priority != 0):
        raise StoreUnavailable("the job table has no concurrency keys yet: run `python -m agentlife db init`")


def claim_limits_from_env(env: Mapping[str, str]) -> ClaimLimits:
    """The limits of ``env`` (a worker's environment), checked at boot.

    Raises:
        ConfigError: a limit that is not a whole number from 1 to `RUNNING_LIMIT_MAX`, overrides that are
            not a JSON object of keys to such numbers, or a key `validate_concurrency_key` refuses.
    """
    overrides: dict[str, int] = {}
    raw = _set_value(env, KEY_LIMITS_ENV)
    if raw is not None:
        import json  # orjson keeps the last of a repeated key silently; a config must not

        try:
            parsed: Any = json.loads(raw, object_pairs_hook=_no_repeated_keys)
        except ValueError as exc:
            if isinstance(exc, _RepeatedKey):
                raise ConfigError(f"{KEY_LIMITS_ENV} names key {str(exc)[:40]!r} twice") from None
            raise ConfigError(
                f'{KEY_LIMITS_ENV} is not JSON: write an object of keys to limits, {{"tenant-a": 2}}'
            ) from None
        if not isinstance(parsed, dict):
            raise ConfigError(f'{KEY_LIMITS_ENV} must be a JSON object of keys to limits, {{"tenant-a": 2}}')
        for key, value in parsed.items():
            validate_concurrency_key(key, f"a key of {KEY_LIMITS_ENV}")
            overrides[key] = _limit(value, f"{KEY_LIMITS_ENV}[{key[:40]!r}]")
    return ClaimLimits(
        key_default=_env_limit(env, KEY_LIMIT_ENV),
        key_limits=overrides,
        agent=_env_limit(env, AGENT_LIMIT_ENV),
    )


class _RepeatedKey(ValueError):
    """A JSON object names one key twice (the message is the key)."""


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _RepeatedKey(key)
        found[key] = value
    return found


def _set_value(env: Mapping[str, str], name: str) -> str | None:
    """``name``'s value stripped; None when unset; `ConfigError` when set but blank.

    A blank value is most likely a template that rendered nothing (a Helm value left out): read as "no
    limit" it would lift the limit from the whole fleet without a word.
    """
    raw = env.get(name)
    if raw is None:
        return None
    if not raw.strip():
        raise ConfigError(f"{name} is set but blank: give a limit, or leave it unset for no limit")
    return raw.strip()


def _env_limit(env: Mapping[str, str], name: str) -> int | None:
    raw = _set_value(env, name)
    if raw is None:
        return None
    if not _WHOLE.fullmatch(raw):
        raise ConfigError(f"{name}={raw[:24]!r} is not a whole number from 1 to {RUNNING_LIMIT_MAX}")
    return _limit(int(raw), name)


def _limit(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be a whole number from 1 to {RUNNING_LIMIT_MAX}, got {_shown(value)}")
    if not 1 <= value <= RUNNING_LIMIT_MAX:
        raise ConfigError(
            f"{name}={_shown(value)} is out of range: a running limit is from 1 to {RUNNING_LIMIT_MAX}"
            " (unset it for no limit)"
        )
    return value


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 24 else text[:24] + "..."
