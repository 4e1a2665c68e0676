"""Who did an operator action: the actor recorded with it in the job's history.

Every operator action (approve, reject, cancel, retry) records an actor and a time. The command line and
`agentlife.Client` default to `default_actor` (the user and host of the process); the console takes it from
a header its proxy sets, only when told to trust that header, else names itself and the remote address.
"""

from __future__ import annotations

import getpass
import socket
import unicodedata
from collections.abc import Callable

__all__ = ["MAX_ACTOR", "check_actor", "default_actor"]

#: The most characters of an actor.
MAX_ACTOR = 200
#: What stands for a user or host name that cannot be read (no passwd entry, no hostname).
_UNKNOWN = "unknown"


def default_actor() -> str:
    """``user@host`` of this process; ``unknown`` for a part that cannot be read or is not a valid actor.

    Never raises: a container without a passwd entry for its uid (``getpass`` fails) or a hostname with
    control characters gives ``unknown@host`` or ``user@unknown``.
    """
    return f"{_part(_user)}@{_part(socket.gethostname)}"


def _user() -> str:
    return getpass.getuser()


def _part(read: Callable[[], str]) -> str:
    try:
        value = read()
    except Exception:  # any failure to read a name means "unknown"
        return _UNKNOWN
    if not isinstance(value, str) or not value or "@" in value:
        return _UNKNOWN
    try:
        return check_actor(value[: MAX_ACTOR // 2 - 1])
    except ValueError:
        return _UNKNOWN


def check_actor(text: str) -> str:
    """``text`` when it is 1 to `MAX_ACTOR` printable characters, none a control or format character.

    Nothing is stripped or changed: the actor recorded is exactly the one given. A format character (a
    right-to-left override, a zero-width joiner) could make one actor look like another on a page.

    Raises:
        ValueError: not text, empty, longer than `MAX_ACTOR`, or holding a control or format character;
            the message is one line and does not echo the value.
    """
    if not isinstance(text, str):
        # ValueError, as for every other bad actor: callers turn one exception into their refusal.
        raise ValueError(f"the actor must be text, got {type(text).__name__}")  # noqa: TRY004
    if not text or len(text) > MAX_ACTOR:
        raise ValueError(f"the actor must be 1 to {MAX_ACTOR} characters, got {len(text)}")
    if not text.strip():
        raise ValueError("the actor must not be blank")
    if not text.isprintable() or any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text):
        raise ValueError("the actor must be printable text on one line, without control or format characters")
    return text
