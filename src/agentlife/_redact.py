"""Keeping secrets out of logs, journals, heartbeats, crash records and ``/status``.

Two nets: the exact values of secret-looking environment variables (API keys, tokens, passwords) are
replaced wherever they appear, and well-known secret shapes (bearer tokens, ``sk-ant-`` keys, passwords in
connection strings) are masked even when their value was never in the environment.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MASK", "Redactor"]

MASK = "***"
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.IGNORECASE)
_PATTERNS = (
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{6,}"),
    re.compile(r"sk-ant-[A-Za-z0-9_-]{6,}"),
    re.compile(r"(?i)\b(sk|pk|rk)-[A-Za-z0-9_-]{16,}"),
    # scheme://user:password@host -> scheme://user:***@host
    re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s/]+(@)"),
    re.compile(r"(?i)((?:password|passwd|pwd|token|api[_-]?key|secret)\s*[=:]\s*)[^\s&;,'\"]+"),
)
# Values this short are too likely to occur by chance ("1", "true"); the patterns still catch their shapes.
_MIN_SECRET_LEN = 6


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
            match = re.search(r"://[^:/@\s]*:([^@\s/]+)@", value)
            if match:
                secrets.append(match.group(1))
        return cls([*secrets, *extra])

    def redact(self, text: str) -> str:
        """``text`` with every secret masked."""
        for value in self._values:
            if value in text:
                text = text.replace(value, MASK)
        for pattern in _PATTERNS:
            text = pattern.sub(_mask_match, text)
        return text

    def redact_obj(self, value: Any) -> Any:
        """A copy of a JSON-like value with every string redacted (keys included)."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, Mapping):
            return {self.redact(str(k)): self.redact_obj(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.redact_obj(v) for v in value]
        return value


def _mask_match(match: re.Match[str]) -> str:
    groups = [g for g in match.groups() if g is not None]
    if len(groups) == 2:
        return f"{groups[0]}{MASK}{groups[1]}"
    if len(groups) == 1:
        return f"{groups[0]}{MASK}"
    return MASK
