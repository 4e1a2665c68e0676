"""Keeping secrets out of logs, journals, heartbeats, crash records and ``/status``.

Two nets: the exact values of secret-looking environment variables (API keys, tokens, passwords) are
replaced wherever they appear, and well-known secret shapes (bearer tokens, ``sk-ant-`` keys, passwords in
connection strings) are masked even when their value was never in the environment.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MASK", "MAX_DEPTH", "Redactor", "url_password"]

MASK = "***"
# TOKEN but not TOKENS: AGENTLIFE_BUDGET_MAX_INPUT_TOKENS is a budget, not a credential.
_SECRET_NAME = re.compile(r"(KEY|TOKEN(?!S)|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.IGNORECASE)
# scheme://user:password@host. A password may hold unencoded "/", "#", "?" and even "@" (people paste them
# as they are): it runs to the *last* "@" of the URL's word, so whatever it holds is masked whole.
_URL_PASSWORD = re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^:/@\s'\"]*:)([^\s'\"]+)(@)")
_PATTERNS = (
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{6,}"),
    re.compile(r"sk-ant-[A-Za-z0-9_-]{6,}"),
    re.compile(r"(?i)\b(sk|pk|rk)-[A-Za-z0-9_-]{16,}"),
    re.compile(r"(?i)((?:password|passwd|pwd|token|api[_-]?key|secret)\s*[=:]\s*)[^\s&;,'\"]+"),
)
# Values this short are too likely to occur by chance ("1", "true"); the patterns still catch their shapes.
_MIN_SECRET_LEN = 6
#: How deep `Redactor.redact_obj` walks. orjson (journal, stores) refuses 255 levels, so every value the
#: journal can hold is redacted exactly; anything deeper could not be written anyway.
MAX_DEPTH = 254


class Redactor:
    """Replaces known secret values and secret-shaped substrings with ``***``."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {s for s in secrets if s and len(s) >= _MIN_SECRET_LEN}
        # Longest first, so a secret that contains another is replaced whole.
        self._values = sorted(values, key=len, reverse=True)

    @classmethod
    def from_env(cls, env: Mapping[str, str], extra: Iterable[str] = ()) -> Redactor:
        """Collect the values of secret-looking variables and the passwords inside URLs in ``env``."""
        secrets = [value for name, value in env.items() if _SECRET_NAME.search(name)]
        for value in env.values():
            password = url_password(value)
            if password:
                secrets += [password, urllib.parse.unquote(password)]
        return cls([*secrets, *extra])

    def redact(self, text: str) -> str:
        """``text`` with every secret masked."""
        for value in self._values:
            if value in text:
                text = text.replace(value, MASK)
        text = _URL_PASSWORD.sub(_mask_match, text)
        for pattern in _PATTERNS:
            text = pattern.sub(_mask_match, text)
        return text

    def redact_obj(self, value: Any) -> Any:
        """A copy of a JSON-like value with every string redacted (keys included); never raises.

        A container met again inside itself becomes ``"<cycle: list>"`` and one nested deeper than
        `MAX_DEPTH` becomes ``"<nested too deep: dict>"``: the walk is bounded, so masking the result of a
        tool that already did its side effect cannot crash the step (and make a retry repeat the effect).
        Other values are returned as they are.
        """
        return self._walk(value, 0, set())

    def _walk(self, value: Any, depth: int, open_ids: set[int]) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if not isinstance(value, (Mapping, list, tuple)):
            return value
        if id(value) in open_ids:
            return f"<cycle: {type(value).__name__}>"
        if depth >= MAX_DEPTH:
            return f"<nested too deep: {type(value).__name__}>"
        open_ids.add(id(value))
        try:
            if isinstance(value, Mapping):
                return {
                    self.redact(k if isinstance(k, str) else str(k)): self._walk(v, depth + 1, open_ids)
                    for k, v in value.items()
                }
            return [self._walk(v, depth + 1, open_ids) for v in value]
        finally:
            open_ids.discard(id(value))


def url_password(text: str) -> str | None:
    """The password of a ``scheme://user:password@host`` URL, however many ``/#?@`` it holds unencoded."""
    match = _URL_PASSWORD.search(text)
    return match.group(2) if match else None


def _mask_match(match: re.Match[str]) -> str:
    groups = [g for g in match.groups() if g is not None]
    if len(groups) == 3:  # prefix, secret, suffix
        return f"{groups[0]}{MASK}{groups[2]}"
    if len(groups) == 2:
        return f"{groups[0]}{MASK}{groups[1]}"
    if len(groups) == 1:
        return f"{groups[0]}{MASK}"
    return MASK
