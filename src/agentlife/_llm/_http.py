"""What the two HTTP model clients share: the base URL check, the loopback test, the response holder."""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Callable
from typing import Any

from agentlife._exceptions import LLMConfigurationError

__all__ = ["ResponseHolder", "http_base_url", "is_loopback"]


def http_base_url(url: str, variable: str, redact: Callable[[str], str]) -> urllib.parse.SplitResult:
    """``url`` split, when it is an ``http://`` or ``https://`` URL with a host and a valid port.

    Raises:
        LLMConfigurationError: naming ``variable``, before any request: ``localhost:8080`` (no scheme),
            ``http://[::1`` (urllib cannot split it), a port past 65535. Retrying could not help.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 0) >= 0
    except ValueError:
        valid = False
    if not valid:
        raise LLMConfigurationError(
            redact(f"{variable} {url!r} is not an http:// or https:// URL of the API root")
        )
    return parts


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine (a proxy from the environment must not catch such requests)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class ResponseHolder:
    """The HTTP response of one call once its headers arrived, so the guard can close it."""

    __slots__ = ("response",)

    def __init__(self) -> None:
        self.response: Any = None

    async def aclose(self) -> None:
        """Close the response, once (the server sees the disconnect at once)."""
        response, self.response = self.response, None
        if response is not None:
            await response.aclose()
