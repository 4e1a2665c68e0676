"""Reading job rows that someone else may have written: a column that does not decode never stops a reader.

A job row's JSON columns (``payload``, ``tokens_consumed``, ``token_budget``, ``error``, ``result``) can hold
what agentlife cannot read: text that is not JSON (SQLite stores any text, any bytes), a number no float
holds (``1e400`` is valid jsonb on PostgreSQL), or the wrong JSON type (an object where the crash history's
list belongs). `job_record` builds the `JobRecord` anyway: each such column gets its neutral value and is
named, with the reason, in ``JobRecord.unreadable``, so ``job list``, ``job show`` and ``job cancel`` still
work on the row. A row whose crash history does not decode keeps that history's raw text in a marker entry,
so the next write that appends to the history loses nothing.

What a claimer does with such a row: `set_aside_entry` is the crash-history entry that records why it was
moved to DEAD_LETTER instead of being run (`SET_ASIDE_STATUS`); it has no ``exit_code``, so it counts as
a crash for no retry limit and no circuit breaker. ``job retry`` makes it runnable again once the row is
mended.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from agentlife._logging import log_fields
from agentlife.stores._base import JobRecord, JobStatus

__all__ = [
    "JSON_COLUMNS",
    "SET_ASIDE_CLASS",
    "SET_ASIDE_STATUS",
    "appended",
    "as_bytes",
    "as_text",
    "decode_histories",
    "dumps",
    "job_record",
    "log_set_aside",
    "set_aside_entry",
    "unreadable_summary",
]

log = logging.getLogger("agentlife.store")

#: The job row's JSON columns, in the order the stores select them.
JSON_COLUMNS = ("payload", "tokens_consumed", "token_budget", "error", "result")
#: Where a claimer puts a row it cannot read, and the ``error_class`` of the entry that says why.
SET_ASIDE_STATUS = JobStatus.DEAD_LETTER
SET_ASIDE_CLASS = "UnreadableRow"
#: The ``event`` of the marker entry that keeps an unreadable crash history's raw text.
UNREADABLE_HISTORY_EVENT = "unreadable_history"
#: The JSON type each column must have when it is not NULL (anything else is unreadable).
_TYPES: dict[str, tuple[type, ...]] = {
    "tokens_consumed": (dict,),
    "token_budget": (dict,),
    "error": (list,),
}
_NEUTRAL: dict[str, Any] = {"tokens_consumed": {}, "error": []}
_TYPE_NAMES: dict[type, str] = {dict: "an object", list: "a list"}


def _json_type(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    return "a number" if isinstance(value, (int, float)) else "null"


def decode_column(name: str, raw: str | bytes | None) -> tuple[Any, str | None]:
    """``(value, None)`` for a column that decodes, ``(neutral value, why)`` for one that does not."""
    if raw is None:
        return _NEUTRAL.get(name), None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # orjson's message says where, never what: the column may hold a secret.
        return _NEUTRAL.get(name), f"not JSON agentlife can read ({exc})"
    expected = _TYPES.get(name)
    if value is not None and expected is not None and not isinstance(value, expected):
        want = " or ".join(_TYPE_NAMES[t] for t in expected)
        return _NEUTRAL.get(name), f"{_json_type(value)} where {want} belongs"
    if value is None:
        return _NEUTRAL.get(name), None
    return value, None


def _raw_text(raw: str | bytes) -> str:
    return raw if isinstance(raw, str) else raw.decode("utf-8", "backslashreplace")


def job_record(columns: Mapping[str, Any]) -> JobRecord:
    """A `JobRecord` from one row's columns, the JSON ones raw (text or bytes) as the store returned them.

    ``columns`` holds ``id``, ``agent_id``, ``status``, ``attempt``, the JSON columns and, optionally,
    ``checkpoint_id``, ``checkpoint_crc``, ``heartbeat_at``, ``updated_at`` and ``not_before`` (unix times).
    """
    values: dict[str, Any] = {}
    unreadable: dict[str, str] = {}
    for name in JSON_COLUMNS:
        raw = columns.get(name)
        value, why = decode_column(name, raw)
        if why is not None:
            unreadable[name] = why
            if name == "error" and raw is not None:
                # Keep the history's text in the history: whatever appends to it next writes it back.
                value = [{"event": UNREADABLE_HISTORY_EVENT, "message": why, "raw": _raw_text(raw)}]
        values[name] = value
    attempt, why = _attempt(columns["attempt"])
    if why is not None:
        unreadable["attempt"] = why
    return JobRecord(
        id=columns["id"],
        agent_id=columns["agent_id"],
        status=columns["status"],
        payload=values["payload"],
        attempt=attempt,
        checkpoint_id=columns.get("checkpoint_id"),
        checkpoint_crc=columns.get("checkpoint_crc"),
        heartbeat_at=columns.get("heartbeat_at"),
        tokens_consumed=values["tokens_consumed"],
        token_budget=values["token_budget"],
        error=values["error"],
        result=values["result"],
        updated_at=columns.get("updated_at"),
        not_before=columns.get("not_before"),
        unreadable=unreadable,
        concurrency_key=_key(columns.get("concurrency_key")),
        priority=_priority(columns.get("priority")),
        incarnation=_key(columns.get("incarnation")),
    )


def _key(raw: Any) -> str | None:
    """The concurrency key as text: bytes that are not UTF-8 with U+FFFD.

    The key is only shown here and compared by the database, so a row another client wrote runs all the same.
    """
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, bytes | bytearray | memoryview):
        return bytes(raw).decode(errors="replace")
    return str(raw)


def _priority(raw: Any) -> int:
    """The priority as an int: 0 for a value another client wrote that is not a whole number."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    return 0


def _attempt(raw: Any) -> tuple[int, str | None]:
    """The row's attempt as an int, or 0 and why not (SQLite keeps whatever another client wrote there)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw, None
    if isinstance(raw, float) and raw.is_integer() and abs(raw) < 2**53:
        return int(raw), None
    return 0, f"not a whole number: {type(raw).__name__}"


def unreadable_summary(row: JobRecord) -> str:
    """One line naming each unreadable column and why: ``payload: not JSON ...; error: an object ...``."""
    return "; ".join(f"{name}: {why}" for name, why in row.unreadable.items())


def set_aside_entry(row: JobRecord, at: float) -> dict[str, Any]:
    """The crash-history entry of a row a claimer moved to DEAD_LETTER because it cannot read it."""
    return {
        "at": at,
        "attempt": row.attempt,
        "error_class": SET_ASIDE_CLASS,
        "message": f"the job row cannot be read, so the job cannot run: {unreadable_summary(row)}",
        "decision": str(SET_ASIDE_STATUS),
    }


def log_set_aside(row: JobRecord) -> None:
    """The warning a claimer logs for each row it set aside."""
    log.warning(
        "job %s set aside as %s: its row cannot be read (%s); fix the row, then `job retry %s`",
        row.id,
        SET_ASIDE_STATUS,
        unreadable_summary(row),
        row.id,
        extra=log_fields(job_id=row.id, decision=str(SET_ASIDE_STATUS), event="set_aside"),
    )


def decode_histories(raws: Iterable[str | bytes | None]) -> Iterable[list[Any]]:
    """The crash histories of ``raws`` (``error`` columns), an unreadable one as empty."""
    for raw in raws:
        yield decode_column("error", raw)[0] or []


def as_text(value: Any, errors: str = "strict") -> str | None:
    """A text column read as stored (bytes on SQLite) as text; None for NULL.

    Bytes that are not UTF-8 are None with ``errors="strict"``; ``"replace"`` shows them as U+FFFD.
    """
    if value is None or isinstance(value, str):
        return value
    try:
        return bytes(value).decode(errors=errors)
    except UnicodeDecodeError:
        return None


def as_bytes(value: Any) -> bytes:
    """A stored message as bytes: SQLite keeps whatever type was written, a hand edit's TEXT too.

    Whatever it is becomes bytes and the reader decides, never an error of its own (``bytes(5)`` would be
    five zero bytes, ``bytes("x")`` a TypeError).
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return str(value).encode("utf-8", "backslashreplace")


def dumps(value: Any) -> str | None:
    """A value as the JSON text of a JSON column (None stays NULL)."""
    return None if value is None else orjson.dumps(value).decode()


def appended(row: JobRecord, entry: dict[str, Any]) -> dict[str, Any]:
    """The parameters of a write that appends ``entry`` to the row's crash history.

    ``entry`` (JSON) for a database that appends in SQL (PostgreSQL's jsonb), and ``history``: the list the
    row was read with (under its lock) plus the entry, for one that writes the whole list (SQLite). A
    history that did not decode is read as its marker entry (see `job_record`), so its text is kept.
    """
    return {"entry": dumps(entry), "history": dumps([*row.error, entry])}
