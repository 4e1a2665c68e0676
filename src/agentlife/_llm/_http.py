"""What the two HTTP model clients share: base URL check, loopback test, lazy client, response holder."""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Callable

import anyio
import anyio.to_thread

from agentlife._exceptions import LLMConfigurationError
from agentlife._llm import _loopback_http
from agentlife._llm._transport import StreamingResponse, Transport

__all__ = ["LazyClient", "ResponseHolder", "http_base_url", "is_loopback", "loopback_client"]


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


def loopback_client(
    parts: urllib.parse.SplitResult,
    headers: dict[str, str],
    *,
    connect_timeout: float | None,
    read_timeout: float | None,
) -> Transport | None:
    """The `agentlife._llm._loopback_http` client for a plain ``http://`` server on this machine.

    Such a server needs none of httpx (no TLS, no proxy, no redirect). None for any other base URL.
    """
    if parts.scheme != "http" or not is_loopback(parts.hostname or ""):
        return None
    return _loopback_http.Client(headers=headers, connect_timeout=connect_timeout, read_timeout=read_timeout)


class ResponseHolder:
    """The HTTP response of one call once its headers arrived, so the guard can close it."""

    __slots__ = ("response",)

    def __init__(self) -> None:
        self.response: StreamingResponse | None = None

    async def aclose(self) -> None:
        """Close the response, once (the server sees the disconnect at once)."""
        response, self.response = self.response, None
        if response is not None:
            await response.aclose()


class LazyClient:
    """An adapter's `Transport`, built once, on first use, on a worker thread.

    Importing httpx and building its client (see `agentlife._llm._tls.tls_context`) would otherwise block
    the loop, and a job that never calls the model never pays for them.

    Args:
        build: returns the transport; raises what the first call should raise (a bad base URL).
    """

    def __init__(self, build: Callable[[], Transport]) -> None:
        self._build = build
        self._http: Transport | None = None

    async def get(self) -> Transport:
        """The transport, built on the first call."""
        http = self._http
        if http is None:
            http, spare = self._keep(await anyio.to_thread.run_sync(self._build))
            if spare is not None:
                await spare.aclose()
        return http

    def _keep(self, built: Transport) -> tuple[Transport, Transport | None]:
        """(the transport kept, the spare to close): a concurrent first call may have built one already."""
        if self._http is not None:
            return self._http, built
        self._http = built
        return built, None

    async def aclose(self) -> None:
        """Close the client and its connection pool (idempotent)."""
        http, self._http = self._http, None
        if http is not None:
            with anyio.move_on_after(5.0, shield=True):
                await http.aclose()
