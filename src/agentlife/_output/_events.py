"""`JobEvent` and the cursors of a job's output.

A cursor names a place in one job's output: ``"<seq>.<tag>"``, where ``seq`` is the last output row the
follower saw and ``tag`` a keyed hash of the job id and ``seq``. It is opaque to its holder; a cursor of
another job, a string that is not one, or one with its ``seq`` changed is refused in one line (the tag binds
it to its job and place; it is not a secret, a check against mistakes, not against an attacker who reads
this code).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from agentlife._exceptions import ConfigError

__all__ = ["EventKind", "JobEvent", "cursor_for", "parse_cursor"]

#: The kinds of event a follower sees.
EventKind = Literal["published", "status", "delta", "end"]
_TAG_BYTES = 8
_MAX_SEQ_DIGITS = 18  # below 2**63: every store's integer holds it


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One event of a job's output, as a follower sees it."""

    job_id: str
    """The job."""
    cursor: str
    """Where this event leaves the follower: pass it as ``after`` to go on from here. A ``delta`` event
    carries the cursor of the last durable event before it (deltas are not kept)."""
    kind: EventKind
    """``"published"`` (``ctx.publish``), ``"status"`` (the job's status changed), ``"delta"`` (model text
    being streamed, not durable), or ``"end"`` (the job reached a terminal status; the follower ends after
    it)."""
    name: str
    """The published event's name; for ``status`` and ``end`` the new status; ``"text"`` for a delta."""
    value: Any
    """The published value; ``{"status": ..., "attempt": ...}`` for ``status`` and ``end``; ``{"call":
    invocation id, "text": ..., "dropped": bytes left out before this text, "restart": the call was tried
    again and its text starts over}`` for a delta."""
    time: float
    """When it was written (unix seconds, the store's clock; the sender's for a delta)."""

    def to_json(self) -> dict[str, Any]:
        """The event as a JSON object (the HTTP API's SSE ``data``)."""
        return {
            "job_id": self.job_id,
            "cursor": self.cursor,
            "kind": self.kind,
            "name": self.name,
            "value": self.value,
            "time": self.time,
        }


def _tag(job_id: str, seq: int) -> str:
    key = job_id.encode("utf-8", "surrogatepass") + b"\x00" + str(seq).encode()
    return hashlib.blake2b(key, digest_size=_TAG_BYTES, person=b"agentlife-out").hexdigest()


def cursor_for(job_id: str, seq: int) -> str:
    """The cursor after output row ``seq`` of ``job_id`` (0: before the first)."""
    return f"{seq}.{_tag(job_id, seq)}"


def parse_cursor(job_id: str, cursor: object) -> int:
    """The ``seq`` a cursor of ``job_id`` names; `ConfigError` in one line for anything else."""
    if not isinstance(cursor, str):
        raise ConfigError(f"a cursor is a string from a JobEvent, got {type(cursor).__name__}")
    shown = repr(cursor[:40]) + ("..." if len(cursor) > 40 else "")
    seq_text, dot, tag = cursor.partition(".")
    if (
        not dot
        or not seq_text.isascii()
        or not seq_text.isdigit()
        or len(seq_text) > _MAX_SEQ_DIGITS
        or (len(seq_text) > 1 and seq_text.startswith("0"))
    ):
        raise ConfigError(f"cursor {shown} is not a cursor of a job's events")
    seq = int(seq_text)
    if tag != _tag(job_id, seq):
        raise ConfigError(f"cursor {shown} is not a cursor of job {job_id[:40]!r}'s events")
    return seq
