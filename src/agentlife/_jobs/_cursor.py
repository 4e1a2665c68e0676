"""The keyset paging cursor of the job list, as URL-safe text: the last row's ``(updated_at, key)`` as stored.

One encoding for every reader of the list (the console's pages, `agentlife.Client.list`): each value keeps
its type (a number, ``inf``, text, text that is not UTF-8, bytes, NULL), since the store compares it as it
orders its rows, so every row appears once however another client spelled its id.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import orjson

from agentlife.stores import JobRecord

__all__ = ["decode_position", "encode_position", "position_of"]


def position_of(row: JobRecord) -> tuple[Any, Any]:
    """Where the page that follows ``row`` starts: its ``updated_at`` and key as the store holds them."""
    return row.updated_at, row.key if row.key is not None else row.id


def encode_position(position: tuple[Any, Any]) -> str:
    """``position`` as URL-safe text (no padding)."""
    raw = orjson.dumps([*_pack(position[0]), *_pack(position[1])])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_position(text: str) -> tuple[Any, Any]:
    """The position `encode_position` wrote as ``text``.

    Raises:
        ValueError: ``text`` is not such a cursor (forged, cut, of another format).
    """
    try:
        value = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        if isinstance(value, list) and len(value) == 2:  # a cursor of an older console: [time, id]
            value = ["n", *value[:1], "s", *value[1:]]
        if not isinstance(value, list):
            raise TypeError("not a list")
        at, rest = _unpack(value)
        key, left = _unpack(rest)
    except (binascii.Error, orjson.JSONDecodeError, ValueError, TypeError, IndexError):
        raise ValueError("not a paging cursor") from None
    if left or not (at is None or isinstance(at, (float, str, bytes))):
        raise ValueError("not a paging cursor")
    return at, key


def _pack(value: Any) -> list[Any]:
    """``value`` as a tag and a JSON value: its type survives the trip through text."""
    if value is None:
        return ["z", None]
    if isinstance(value, bytes):
        return ["b", base64.b64encode(value).decode()]
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:  # `JobRecord.key` of text that is not UTF-8: its bytes
            return ["t", base64.b64encode(value.encode("utf-8", "surrogateescape")).decode()]
        return ["s", value]
    number = float(value)
    return ["n", number if math.isfinite(number) else repr(number)]


def _unpack(items: list[Any]) -> tuple[Any, list[Any]]:
    """The value `_pack` made from the first two items, and the items after them."""
    tag, value, rest = items[0], items[1], items[2:]
    if tag == "z" and value is None:
        return None, rest
    if tag == "s" and isinstance(value, str):
        return value, rest
    if tag in ("b", "t") and isinstance(value, str):
        raw = base64.b64decode(value, validate=True)
        return (raw if tag == "b" else raw.decode("utf-8", "surrogateescape")), rest
    if tag == "n" and value in ("inf", "-inf"):
        return float(value), rest
    if (
        tag == "n"
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    ):
        return float(value), rest
    raise ValueError("not a cursor value")
