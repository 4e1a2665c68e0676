"""The reason an operator gives for a reject or a cancel: recorded in the job's crash history."""

from __future__ import annotations

from agentlife._exceptions import ConfigError

__all__ = ["MAX_REASON", "check_reason"]

#: The most characters of a reason.
MAX_REASON = 500


def check_reason(value: object) -> str:
    """``value`` stripped, when it is printable text of at most `MAX_REASON` characters; else `ConfigError`.

    Printable: a line break or a NUL (which PostgreSQL's JSON cannot store) would split or break the
    history line every tool prints.
    """
    if not isinstance(value, str):
        raise ConfigError(f"the reason must be text, got {type(value).__name__}")
    value = value.strip()
    if len(value) > MAX_REASON:
        raise ConfigError(f"the reason must be at most {MAX_REASON} characters")
    if not value.isprintable():
        raise ConfigError("the reason must be printable text on one line")
    return value
