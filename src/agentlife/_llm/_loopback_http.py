"""The HTTP/1.1 client of a model server on this machine: a local model server, a sidecar, a test server.

Both model adapters send their requests to a loopback ``http://`` base URL through this client rather than
httpx. Such a request needs no TLS, no proxy (the environment's proxies never apply to this machine) and no
redirect, and importing httpx and httpcore (40 to 65 ms of CPU, more where h2 is installed) was the largest
single cost between spawn and the first model request. Every other base URL keeps httpx.

`Client` is an `agentlife._llm._transport.Transport` (``stream``, ``aclose``) and its responses are
`StreamingResponse` s, so the adapters' code is the same over it and over httpx. Its exceptions
(``HTTPError`` and below it ``ConnectError``, ``RemoteProtocolError``, ``TimeoutException``) are the
transport's `TransportError` and `TransportTimeout`, raised as such: there is nothing to translate.

One connection per request (``connection: close``): on loopback a connect costs less than a pool's
bookkeeping, and no request ever meets a kept-alive connection the server closed while it was idle. Every
length a server states is checked before it is trusted: the head is bounded (`MAX_HEAD_BYTES`,
`MAX_HEADERS`), chunk sizes are plain hex of at most 16 digits, a body cut short of its ``content-length``
or inside a chunk is an error, and a compressed body (none is asked for) is refused rather than inflated.
Its error messages name what was wrong, never the server's bytes (beyond a short word such as an
encoding's name): a piece of a line cut to fit a message could be a piece of a secret.

It reads HTTP/1.1 itself rather than with h11 (installed wherever httpx is): importing h11 costs more on
the first request than h11 saves on any one parse, and h11's messages quote the bytes they refuse.
``benchmarks/loopback_parser.py`` measures both.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator, Mapping
from contextlib import aclosing
from typing import Any

import anyio

from agentlife._llm._transport import StreamingResponse, TransportError, TransportTimeout

__all__ = [
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "Client",
    "ConnectError",
    "HTTPError",
    "Headers",
    "LineTooLong",
    "RemoteProtocolError",
    "Request",
    "Response",
    "TimeoutException",
    "split_lines",
]

#: The longest line of a response's head (status line, a header, a chunk size) the client reads.
MAX_HEAD_BYTES = 64 * 1024
#: The most header fields (or trailer fields) one response may send.
MAX_HEADERS = 256
#: The longest line `Response.aiter_lines` gathers, and the largest body `Response.aread` reads.
MAX_BODY_LINE_BYTES = 16 * 1024 * 1024
_READ_SIZE = 64 * 1024
_HEX = frozenset(b"0123456789abcdefABCDEF")
_NO_BODY = frozenset({204, 304})


class HTTPError(TransportError):
    """Any failure of a request sent by this client (a `agentlife._llm._transport.TransportError`)."""


class ConnectError(HTTPError):
    """No connection could be opened."""


class RemoteProtocolError(HTTPError):
    """The server's bytes are not a well-formed HTTP/1.1 response, or stop before it ends."""


class TimeoutException(TransportTimeout, HTTPError):
    """A connect, a write or a read took longer than its timeout."""


class LineTooLong(RemoteProtocolError):
    """A line of a body grew past its limit without an end (`split_lines`)."""


class Headers(Mapping[str, str]):
    """A response's header fields, looked up without regard to case; repeated fields joined by ``, ``."""

    __slots__ = ("_fields",)

    def __init__(self, fields: Iterable[tuple[str, str]] = ()) -> None:
        gathered: dict[str, list[str]] = {}
        for name, value in fields:
            gathered.setdefault(name.lower(), []).append(value)
        # Joined once per name: a server repeating one field cannot make this quadratic.
        self._fields = {key: ", ".join(values) for key, values in gathered.items()}

    def __getitem__(self, name: str) -> str:
        return self._fields[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._fields

    def __repr__(self) -> str:
        return f"Headers({list(self._fields)!r})"  # names only: a value may hold a secret


class Request:
    """One request, built by `Client.build_request`."""

    __slots__ = ("content", "head", "host", "port", "timeouts")

    def __init__(self, host: str, port: int, head: bytes, content: bytes, timeouts: tuple[Any, Any]) -> None:
        self.host, self.port, self.head, self.content, self.timeouts = host, port, head, content, timeouts


class Client:
    """Sends requests to one server on this machine, one connection each.

    Args:
        headers: sent with every request (a request's own headers of the same name win).
        connect_timeout: seconds to open the connection (None: no limit).
        read_timeout: seconds any one write or read may take (None: no limit).
    """

    def __init__(
        self,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float | None = None,
        read_timeout: float | None = None,
    ) -> None:
        self._headers = {k.lower(): str(v) for k, v in (headers or {}).items()}
        self._timeouts = (connect_timeout, read_timeout)

    def build_request(
        self,
        method: str,
        url: str,
        *,
        content: bytes = b"",
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        timeout: Any = None,
    ) -> Request:
        """The request ``method url`` with ``content`` as its body; ``params`` are added to the query.

        ``timeout``: seconds for every phase, or an object with ``connect`` and ``read`` (an
        ``httpx.Timeout``), for this request only.

        Raises:
            HTTPError: ``url`` is not ``http://host[:port]/...``, or a header holds a line break.
        """
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise HTTPError(f"not an http:// URL with a host: {parts.scheme}://{parts.hostname or ''}")
        port = parts.port or 80
        query = parts.query
        if params:
            query = "&".join(q for q in (query, urllib.parse.urlencode(params, doseq=True)) if q)
        target = (parts.path or "/") + (f"?{query}" if query else "")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        fields = dict(self._headers)
        fields.update((k.lower(), str(v)) for k, v in (headers or {}).items())
        fields.update(
            {
                "host": f"{host}:{port}",
                "content-length": str(len(content)),
                "accept-encoding": "identity",
                "connection": "close",
            }
        )
        lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in fields.items())]
        head = "\r\n".join(lines) + "\r\n\r\n"
        if any(c in target or c in field for c in "\r\n\0" for field in lines[1:]):
            raise HTTPError("a header or the URL holds a line break")
        return Request(
            parts.hostname, port, head.encode("latin-1"), content, _timeouts(timeout, self._timeouts)
        )

    async def send(self, request: Request, *, stream: bool = True) -> Response:
        """Send ``request`` and return the response once its head arrived (its body is read as iterated).

        ``stream`` is accepted for httpx's signature: the body is always streamed.

        Raises:
            ConnectError: the connection could not be opened.
            TimeoutException: the connect, the write or the head's read took too long.
            RemoteProtocolError: the server's answer is not an HTTP/1.1 response head.
            HTTPError: the connection failed while the request was written or the head read.
        """
        connect_timeout, read_timeout = request.timeouts
        try:
            with anyio.fail_after(connect_timeout):
                reader, writer = await asyncio.open_connection(
                    request.host, request.port, limit=MAX_HEAD_BYTES
                )
        except TimeoutError:
            raise TimeoutException(f"connecting took over {connect_timeout:g} s") from None
        except OSError as exc:
            raise ConnectError(str(exc) or type(exc).__name__) from exc
        response = Response(reader, writer, read_timeout)
        try:
            writer.write(request.head + request.content)
            await response.drain()
            await response.read_head()
        except BaseException:
            await response.aclose()
            raise
        return response

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
        """`build_request` and `send`: the `agentlife._llm._transport.Transport` method."""
        request = self.build_request(
            method, url, content=content, headers=headers, params=params, timeout=timeout
        )
        return await self.send(request)

    async def aclose(self) -> None:
        """Nothing to close: no connection outlives its response."""


def _timeouts(timeout: Any, default: tuple[Any, Any]) -> tuple[Any, Any]:
    if timeout is None:
        return default
    if isinstance(timeout, int | float):
        return (float(timeout), float(timeout))
    return (getattr(timeout, "connect", None), getattr(timeout, "read", None))


class Response:
    """A response whose head has arrived; its body is read once, by one of the three readers."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float | None
    ) -> None:
        self._reader, self._writer, self._timeout = reader, writer, timeout
        self.status_code = 0
        self.headers = Headers()

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body, piece by piece as it arrives; the connection is closed at its end."""
        try:
            # Closed here, not left to the garbage collector: each generator it finalises costs a
            # wake-up of the event loop and a task, for every response.
            async with aclosing(self._body()) as body:
                async for piece in body:
                    if piece:
                        yield piece
        finally:
            await self.aclose()

    async def aiter_lines(self) -> AsyncIterator[str]:
        """The body's lines (split at CRLF, LF or CR; their ends dropped), decoded as UTF-8.

        Raises:
            RemoteProtocolError: a line grew past `MAX_BODY_LINE_BYTES` without an end.
        """
        async for line in split_lines(self.aiter_bytes(), MAX_BODY_LINE_BYTES):
            yield line

    async def aread(self) -> bytes:
        """The whole body.

        Raises:
            RemoteProtocolError: it passed `MAX_BODY_LINE_BYTES`.
        """
        body = bytearray()
        async for piece in self.aiter_bytes():
            body += piece
            if len(body) > MAX_BODY_LINE_BYTES:
                raise RemoteProtocolError(f"the body passed {MAX_BODY_LINE_BYTES} bytes")
        return bytes(body)

    async def aclose(self) -> None:
        """Close the connection at once (the server sees the disconnect); idempotent."""
        self._writer.transport.abort()

    # -- reading --------------------------------------------------------------------------------------

    async def drain(self) -> None:
        """Wait until the request is written (within the read timeout, as httpx's write timeout)."""
        try:
            with anyio.fail_after(self._timeout):
                await self._writer.drain()
        except TimeoutError:
            raise TimeoutException(f"writing the request took over {self._timeout:g} s") from None
        except OSError as exc:
            raise HTTPError(f"the connection failed while the request was written: {exc}") from exc

    async def read_head(self) -> None:
        """Read the status line and the header fields, past any interim (1xx) response."""
        for _ in range(MAX_HEADERS):
            self.status_code = _status(await self._line())
            fields = await self._fields("header")
            if not 100 <= self.status_code < 200:
                self.headers = Headers(fields)
                return
        raise RemoteProtocolError(f"the server sent over {MAX_HEADERS} interim responses")

    async def _fields(self, what: str) -> list[tuple[str, str]]:
        """Header (or trailer) fields up to the blank line that ends them."""
        fields: list[tuple[str, str]] = []
        while (field := await self._field()) is not None:
            if len(fields) == MAX_HEADERS:
                raise RemoteProtocolError(f"the response sent over {MAX_HEADERS} {what} fields")
            fields.append(field)
        return fields

    async def _field(self) -> tuple[str, str] | None:
        """One header field, or None at the blank line that ends them."""
        line = await self._line()
        if line in (b"\r\n", b"\n"):
            return None
        name, colon, value = line.decode("latin-1").partition(":")
        if not colon or not name or name != name.strip() or " " in name or "\t" in name:
            raise RemoteProtocolError(f"not a header field (a line of {len(line)} bytes)")
        return name, value.strip()

    async def _body(self) -> AsyncGenerator[bytes, None]:
        if self.status_code in _NO_BODY:
            return
        encoding = self.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise RemoteProtocolError(
                f"the server sent a {_token(encoding)}-encoded body though none was asked for"
            )
        transfer = self.headers.get("transfer-encoding")
        if transfer is not None:
            if transfer.strip().lower() != "chunked":
                raise RemoteProtocolError(f"unsupported transfer-encoding {_token(transfer)}")
            async with aclosing(self._chunked()) as chunks:
                async for piece in chunks:
                    yield piece
            return
        length = self.headers.get("content-length")
        if length is None:
            while piece := await self._read(_READ_SIZE):
                yield piece
            return
        async with aclosing(self._exactly(_content_length(length), "its content-length")) as pieces:
            async for piece in pieces:
                yield piece

    async def _chunked(self) -> AsyncGenerator[bytes, None]:
        while True:
            line = await self._line()
            size = line.split(b";", 1)[0].strip()
            if not size or len(size) > 16 or not _HEX.issuperset(size):
                raise RemoteProtocolError(f"not a chunk size (a line of {len(line)} bytes)")
            if int(size, 16) == 0:
                await self._fields("trailer")
                return
            async with aclosing(self._exactly(int(size, 16), "a chunk")) as pieces:
                async for piece in pieces:
                    yield piece
            if await self._line() not in (b"\r\n", b"\n"):
                raise RemoteProtocolError("a chunk was longer than its size said")

    async def _exactly(self, size: int, what: str) -> AsyncGenerator[bytes, None]:
        while size > 0:
            piece = await self._read(min(size, _READ_SIZE))
            if not piece:
                raise RemoteProtocolError(f"the connection closed {size} bytes before the end of {what}")
            size -= len(piece)
            yield piece

    async def _read(self, size: int) -> bytes:
        try:
            if self._timeout is None:
                return await self._reader.read(size)
            with anyio.fail_after(self._timeout):
                return await self._reader.read(size)
        except TimeoutError:
            raise TimeoutException(f"no data from the server for {self._timeout:g} s") from None
        except OSError as exc:
            raise HTTPError(f"the connection failed: {exc}") from exc

    async def _line(self) -> bytes:
        """One line of the head or of the chunk framing (its end kept); EOF before its end is an error."""
        try:
            with anyio.fail_after(self._timeout):
                line = await self._reader.readline()
        except TimeoutError:
            raise TimeoutException(f"no data from the server for {self._timeout:g} s") from None
        except ValueError:  # asyncio's limit: the line passed MAX_HEAD_BYTES
            raise RemoteProtocolError(f"a line of the response passed {MAX_HEAD_BYTES} bytes") from None
        except OSError as exc:
            raise HTTPError(f"the connection failed: {exc}") from exc
        if not line.endswith(b"\n"):
            raise RemoteProtocolError("the connection closed before the response's head or framing ended")
        return line


async def split_lines(pieces: AsyncIterator[bytes], limit: int) -> AsyncGenerator[str, None]:
    """The lines of a byte stream, split at CRLF, LF or CR however the bytes arrive, decoded as UTF-8.

    A line's parts are gathered in a list and joined once, so a line sent a byte at a time costs time
    linear in its length.

    Raises:
        LineTooLong: a line grew past ``limit`` bytes without an end.
    """
    parts: list[bytes] = []
    size = 0
    after_cr = False
    async for piece in pieces:
        if after_cr and piece.startswith(b"\n"):
            piece = piece[1:]  # the LF of a CRLF cut between two pieces
        if not piece:
            continue
        after_cr = piece.endswith(b"\r")
        for segment in piece.splitlines(keepends=True):
            if segment.endswith((b"\n", b"\r")):
                parts.append(segment.rstrip(b"\r\n"))
                yield b"".join(parts).decode("utf-8", "replace")
                parts, size = [], 0
            else:
                parts.append(segment)
                size += len(segment)
                if size > limit:
                    raise LineTooLong(f"a line of the body passed {limit} bytes without an end")
    if parts:
        yield b"".join(parts).decode("utf-8", "replace")


def _token(value: str) -> str:
    """``value`` quoted when it is a short word (``'gzip'``), else its length.

    A message never repeats more of what a server sent, and never a cut piece of it: a cut secret is one a
    redactor cannot recognise.
    """
    word = value.strip()
    if 0 < len(word) <= 24 and all(c.isascii() and (c.isalnum() or c in "-_., ") for c in word):
        return repr(word.lower())
    return f"({len(value)} characters)"


def _status(line: bytes) -> int:
    version, _, rest = line.partition(b" ")
    code = rest[:3]
    if (
        not version.startswith(b"HTTP/1.")
        or len(code) != 3
        or not code.isdigit()
        or rest[3:4] not in (b"", b" ", b"\r", b"\n")
    ):
        raise RemoteProtocolError(f"not an HTTP/1.x status line (a line of {len(line)} bytes)")
    return int(code)


def _content_length(value: str) -> int:
    lengths = {v.strip() for v in value.split(",")}
    if len(lengths) != 1:
        raise RemoteProtocolError(f"conflicting content-lengths ({len(lengths)} values)")
    length = lengths.pop()
    if not length.isascii() or not length.isdigit() or len(length) > 18:
        raise RemoteProtocolError(f"not a content-length ({len(value)} characters)")
    return int(length)
