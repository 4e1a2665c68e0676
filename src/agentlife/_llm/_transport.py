"""The seam between the model adapters and HTTP: one typed protocol, its errors mapped once at the edge.

Both HTTP adapters send one streaming request per call and read one streaming response. Two transports
carry it: agentlife's loopback client (`agentlife._llm._loopback_http`) for a plain ``http://`` server on
this machine, and httpx for every other base URL. The adapters see only `Transport` and
`StreamingResponse`, and only two errors, whichever transport ran:

* `TransportError` (a `ConnectionError`): the request did not get through, or the response broke off or
  broke the protocol;
* `TransportTimeout` (also a `TimeoutError`): a connect, a write or a read took longer than its timeout.

httpx's exceptions are translated here, once, where a request is sent and wherever a response's body is
read (as httpx itself translates httpcore's), and the loopback client raises these two itself; so an
adapter never imports httpx to catch what it raises, and `agentlife._retry.classify` sorts a broken
stream by type on either path.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, Protocol

__all__ = ["HttpxTransport", "StreamingResponse", "Transport", "TransportError", "TransportTimeout"]


class TransportError(ConnectionError):
    """The request did not get through, or its response broke off or broke the protocol."""


class TransportTimeout(TimeoutError, TransportError):
    """A connect, a write or a read took longer than its timeout."""


class StreamingResponse(Protocol):
    """A response whose head has arrived; its body is read once, by one of the three readers."""

    @property
    def status_code(self) -> int:
        """The HTTP status."""
        ...

    @property
    def headers(self) -> Mapping[str, str]:
        """The header fields, looked up without regard to case."""
        ...

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body, piece by piece as it arrives."""
        ...

    def aiter_lines(self) -> AsyncIterator[str]:
        """The body's lines, decoded as UTF-8, their ends dropped."""
        ...

    async def aread(self) -> bytes:
        """The whole body."""
        ...

    async def aclose(self) -> None:
        """Close the response at once (the server sees the disconnect); idempotent."""
        ...


class Transport(Protocol):
    """Sends one streaming request; built once per adapter, off the event loop."""

    async def stream(
        self,
        method: str,
        url: str,
        *,
        content: bytes,
        headers: Mapping[str, str],
        params: Mapping[str, Any] | None = None,
        timeout: Any = None,
    ) -> StreamingResponse:
        """Send the request; return the response once its head arrived.

        ``timeout``: seconds for every phase, or an ``httpx.Timeout``, for this request only (None: the
        transport's own).

        Raises:
            TransportTimeout: the connect, the write or the head's read took too long.
            TransportError: the request did not get through (refused, reset, a malformed answer, a URL
                the transport cannot send to).
        """
        ...

    async def aclose(self) -> None:
        """Close the transport and its connections (idempotent)."""
        ...


class HttpxTransport:
    """`Transport` over an ``httpx.AsyncClient``, httpx's exceptions translated into this module's.

    Args:
        httpx: the ``httpx`` module (imported by the caller, off the event loop).
        client: the client every request goes through; closed by `aclose`.
    """

    def __init__(self, httpx: Any, client: Any) -> None:
        self._httpx = httpx
        self.client = client

    async def stream(
        self,
        method: str,
        url: str,
        *,
        content: bytes,
        headers: Mapping[str, str],
        params: Mapping[str, Any] | None = None,
        timeout: Any = None,
    ) -> StreamingResponse:
        """Send the request with httpx; see `Transport.stream`."""
        with self._mapped():
            request = self.client.build_request(
                method,
                url,
                content=content,
                headers=dict(headers),
                params=params,
                **({} if timeout is None else {"timeout": timeout}),
            )
            return _HttpxResponse(await self.client.send(request, stream=True), self)

    async def aclose(self) -> None:
        """Close the client and its connection pool."""
        await self.client.aclose()

    @contextlib.contextmanager
    def _mapped(self) -> Iterator[None]:
        """Translate httpx's timeouts into `TransportTimeout` and its other errors into `TransportError`.

        The message is httpx's own, naming httpx's class; the original stays the ``__cause__``.
        """
        httpx = self._httpx
        try:
            yield
        except httpx.TimeoutException as exc:
            raise TransportTimeout(_message(exc)) from exc
        except httpx.HTTPError as exc:
            raise TransportError(_message(exc)) from exc


def _message(exc: BaseException) -> str:
    return f"{exc} ({type(exc).__name__})" if str(exc) else type(exc).__name__


class _HttpxResponse:
    """An httpx response whose body readers raise this module's errors."""

    def __init__(self, response: Any, transport: HttpxTransport) -> None:
        self._response = response
        self._transport = transport

    @property
    def status_code(self) -> int:
        return int(self._response.status_code)

    @property
    def headers(self) -> Mapping[str, str]:
        headers: Mapping[str, str] = self._response.headers
        return headers

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        with self._transport._mapped():
            async with contextlib.aclosing(self._response.aiter_bytes()) as pieces:
                async for piece in pieces:
                    yield piece

    async def aiter_lines(self) -> AsyncIterator[str]:
        with self._transport._mapped():
            async for line in self._response.aiter_lines():
                yield line

    async def aread(self) -> bytes:
        with self._transport._mapped():
            body: bytes = await self._response.aread()
            return body

    async def aclose(self) -> None:
        with self._transport._mapped():
            await self._response.aclose()
