"""Who performs an operator's action: recorded with it in the job's crash history."""

from __future__ import annotations

import getpass
import socket
import unicodedata

__all__ = ["MAX_ACTOR", "check_actor", "default_actor"]

#: The most characters of an actor.
MAX_ACTOR = 200


def default_actor() -> str:
    """``user@host`` of this process (``unknown`` for a part the system cannot tell)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (a container's arbitrary uid)
        user = "unknown"
    host = socket.gethostname() or "unknown"
    return check_actor(f"{user}@{host}"[:MAX_ACTOR])


def check_actor(text: str) -> str:
    """``text`` when it is 1 to `MAX_ACTOR` printable characters, else a one-line `ValueError`.

    Control and format characters (a line break, a NUL, a bidirectional override) are refused: the actor is
    printed in one line of every history tools show.
    """
    if not isinstance(text, str):
        raise ValueError(f"the actor must be text, got {type(text).__name__}")  # noqa: TRY004 - one error type
    if not text or len(text) > MAX_ACTOR:
        raise ValueError(f"the actor must be 1 to {MAX_ACTOR} characters, got {len(text)}")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp") for c in text):
        raise ValueError("the actor must be printable text on one line (no control or format characters)")
    return text
