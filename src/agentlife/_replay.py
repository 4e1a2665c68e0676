"""What makes replay safe: call digests and the exact-value rule.

Replay returns a recorded result instead of calling again, so two things must hold:

- the call being replayed is the call that was recorded. Every journaled call carries a *digest* of what
  identifies it (a tool's name and arguments; an LLM request's model, system prompt, messages, tools and
  parameters), and replay compares it before returning anything (`ReplayMismatch` otherwise);
- the value replayed equals the value the live call returned. JSON (through orjson) is the journal's and
  the checkpoint's format, so a value that JSON would silently change (a tuple turning into a list, a
  datetime into a string, NaN into null) or cannot write at all (a cycle, a string with a lone surrogate,
  nesting past what orjson writes) is refused where it enters, by `check_replayable`, with a message that
  names the value's owner and the path inside it.

A digest is 16 hex characters (64 bits) of SHA-256 over the canonical orjson of the call (sorted keys).
It identifies a call; it is not a secrecy mechanism, though no argument value can be read back from it.
The journal file (mode 0600) already holds the call's results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentlife._exceptions import UnreplayableValue

__all__ = [
    "MAX_DEPTH",
    "check_replayable",
    "llm_request_digest",
    "nesting",
    "tool_call_digest",
    "utf8_safe",
]

_DIGEST_CHARS = 16
_MIN_INT = -(2**63)  # orjson's range: beyond it a value cannot be written at all
_MAX_INT = 2**64 - 1
#: How deeply a recorded value may nest. orjson writes at most 254 levels and the masking walk keeps
#: 254, counted from the journal line, which holds a tool result one level down and an LLM response four;
#: half of that leaves every holder room, and is the limit of a job payload too.
MAX_DEPTH = 128
_MAX_PATH_CHARS = 80


def tool_call_digest(tool: str, args: Mapping[str, Any]) -> str:
    """The digest of a tool call: its name and arguments (``TOOL_STARTED.digest``)."""
    return _digest({"tool": tool, "args": args})


def llm_request_digest(
    model: str, messages: Sequence[Mapping[str, Any]], max_tokens: int, params: Mapping[str, Any]
) -> str:
    """The digest of an LLM request: model, messages, max_tokens and every other parameter.

    ``params`` holds ``system``, ``tools`` and the sampling parameters as passed to ``complete``; tool
    functions in ``tools`` count by their name.
    """
    return _digest({"model": model, "messages": messages, "max_tokens": max_tokens, "params": params})


def _digest(obj: Any) -> str:
    # Imported here: `import agentlife` loads this module (Done checks its result) and must stay as
    # cheap as `import asyncio`; by the time a call is digested, the journal has loaded both.
    import hashlib

    import orjson

    try:
        data = orjson.dumps(obj, default=_identity, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        data = repr(obj).encode("utf-8", "backslashreplace")
    return hashlib.sha256(data).hexdigest()[:_DIGEST_CHARS]


def _identity(value: Any) -> Any:
    """What a non-JSON value counts as in a digest: a tool by its name, anything else by its type and str."""
    name = getattr(value, "name", None)
    if isinstance(name, str):
        return f"<{type(value).__name__} {name}>"
    if isinstance(value, (set, frozenset)):
        return sorted(map(repr, value))
    return f"<{type(value).__name__} {value}>"


def check_replayable(value: Any, owner: str) -> None:
    """Refuse a value that the journal or the checkpoint would not give back exactly.

    Accepted: None, bool, str (without lone surrogates, which UTF-8 cannot encode), int in the 64-bit
    range orjson writes, finite float, list, and dict with str keys, nested up to `MAX_DEPTH` (128)
    levels. Everything else (tuple, set, bytes, datetime, Decimal, NaN, a custom object, a cycle) raises.

    Args:
        value: the value about to be recorded.
        owner: what the value is, for the message (``"tool fetch's result"``, ``"ctx.state"``).

    Raises:
        UnreplayableValue: naming ``owner``, the path inside the value and its type.
    """
    _check(value, owner, "", 0, set())


def _check(value: Any, owner: str, path: str, depth: int, seen: set[int]) -> None:
    if isinstance(value, str):
        if not _encodable(value):
            _refuse(owner, path, "a string with a lone surrogate (UTF-8 cannot encode it)")
        return
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not _MIN_INT <= value <= _MAX_INT:
            _refuse(owner, path, "an int beyond the 64-bit range (pass it as a string)")
        return
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            _refuse(owner, path, f"{value!r} (JSON has no NaN or infinity)")
        return
    if depth >= MAX_DEPTH:
        _refuse(owner, path, f"a value nested deeper than {MAX_DEPTH} levels")
    if type(value) in (list, dict):
        if id(value) in seen:
            _refuse(owner, path, "a cycle (a container that contains itself)")
        seen.add(id(value))
        _check_children(value, owner, path, depth, seen)
        seen.discard(id(value))
        return
    _refuse(owner, path, _describe(value))


def _check_children(value: Any, owner: str, path: str, depth: int, seen: set[int]) -> None:
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check(item, owner, f"{path}[{index}]", depth + 1, seen)
        return
    for key, item in value.items():
        if not isinstance(key, str):
            _refuse(owner, f"{path}[{key!r}]", f"a dict key of type {type(key).__name__} (keys must be str)")
        if not _encodable(key):
            _refuse(owner, f"{path}[{key!r}]", "a dict key with a lone surrogate (UTF-8 cannot encode it)")
        _check(item, owner, f"{path}[{key!r}]", depth + 1, seen)


def nesting(value: Any, cap: int) -> int:
    """How many levels of dicts and lists ``value`` nests (0 for a scalar, 1 for a flat dict), up to ``cap``.

    Walked one level at a time, never by recursion, and never past ``cap``: a value nested 10 000 deep (a
    model can send one) costs its first ``cap`` levels, and a container met again on one level (shared, or
    a cycle) is walked once there.
    """
    if not _is_container(value):
        return 0
    level, frontier = 0, [value]
    while frontier and level < cap:
        level += 1
        below: dict[int, Any] = {}
        for item in frontier:
            children = item.values() if isinstance(item, Mapping) else item
            below.update((id(child), child) for child in children if _is_container(child))
        frontier = list(below.values())
    return level


def _is_container(value: Any) -> bool:
    return isinstance(value, Mapping | list | tuple)


def utf8_safe(text: str) -> str:
    """``text`` with each lone surrogate written as its escape, for text that is only shown or logged.

    orjson refuses a string UTF-8 cannot encode; an exception message or an argument may hold one.
    """
    if _encodable(text):
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _encodable(text: str) -> bool:
    """Whether UTF-8 can encode ``text``: a surrogate code point (U+D800 to U+DFFF) on its own it cannot."""
    if text.isascii():  # the common case, without copying the string
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_HINTS: Mapping[type, str] = {
    tuple: "a tuple (it would come back as a list: use a list)",
    set: "a set (use a sorted list)",
    frozenset: "a frozenset (use a sorted list)",
    bytes: "bytes (decode them, or base64-encode them)",
    bytearray: "a bytearray (decode it, or base64-encode it)",
}


def _describe(value: Any) -> str:
    hint = _HINTS.get(type(value))
    if hint is not None:
        return hint
    module = type(value).__module__
    name = type(value).__qualname__ if module == "builtins" else f"{module}.{type(value).__qualname__}"
    return f"a {name} (convert it to JSON types: dict with str keys, list, str, int, float, bool, None)"


def _refuse(owner: str, path: str, what: str) -> None:
    if len(path) > _MAX_PATH_CHARS:  # 128 levels of "[0]": keep the message short
        path = f"{path[: _MAX_PATH_CHARS // 2]}...{path[-_MAX_PATH_CHARS // 2 :]}"
    where = f" at {path}" if path else ""
    raise UnreplayableValue(f"{owner} holds {what}{where}: the journal could not give it back exactly")
