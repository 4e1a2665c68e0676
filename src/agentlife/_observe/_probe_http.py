"""The smallest HTTP/1.1 server the probes need, on asyncio streams, with hard limits.

The probe port answers four GET/HEAD paths to a kubelet that sends one short request per connection.
A general HTTP framework would cost hundreds of milliseconds of imports at boot (``aiohttp.web`` ~370 ms) on a
thread that competes with boot for the interpreter lock, and its generality is attack surface here. This
speaks exactly: one request line, at most ``MAX_HEADERS`` header lines of at most ``MAX_LINE`` bytes, no body
(a request that announces one gets 413), its answer; keep-alive and pipelining are honoured for well-formed
requests. A client that has not sent its whole request within the client timeout (or stays idle that long
between requests) is disconnected without an answer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

__all__ = ["MAX_HEADERS", "MAX_LINE", "HttpRequest", "RequestError", "read_request", "render_response"]

MAX_LINE = 4096
MAX_HEADERS = 32
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """What the probes need of a request."""

    method: str
    path: str
    has_body: bool
    keep_alive: bool = False


class RequestError(Exception):
    """A request we refuse before routing it, with the status to answer."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


async def _read_line(reader: asyncio.StreamReader, too_long: int) -> bytes:
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise RequestError(too_long, "line too long") from None
    except asyncio.IncompleteReadError:
        raise EOFError from None  # closed before a whole line: nobody is left to answer
    if len(line) > MAX_LINE:
        raise RequestError(too_long, "line too long")
    return line.rstrip(b"\r\n")


async def read_request(reader: asyncio.StreamReader) -> HttpRequest:
    """Read one request head; the caller bounds it in time.

    Raises:
        EOFError: the client closed without sending anything.
        RequestError: a malformed or oversized request.
    """
    try:
        first = await reader.readexactly(1)
    except asyncio.IncompleteReadError:
        raise EOFError from None
    if not first.isalpha():  # a TLS handshake or binary garbage: refuse at once, not at the timeout
        raise RequestError(400, "not an HTTP request")
    line = first + await _read_line(reader, 414)
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise RequestError(400, "malformed request line")
    method_raw, target_raw, version = parts
    if not version.startswith(b"HTTP/1."):
        raise RequestError(505 if version.startswith(b"HTTP/") else 400, "unsupported protocol")
    try:
        method, target = method_raw.decode("ascii"), target_raw.decode("ascii")
    except UnicodeDecodeError:
        raise RequestError(400, "non-ASCII request line") from None
    if not method.isalpha() or not method.isupper():
        raise RequestError(400, "malformed method")
    has_body = False
    keep_alive = version == b"HTTP/1.1"
    for _ in range(MAX_HEADERS + 1):
        header = await _read_line(reader, 431)
        if not header:
            return HttpRequest(method, _path_of(target), has_body, keep_alive and not has_body)
        name, sep, value = header.partition(b":")
        if not sep or not name or name != name.strip():
            raise RequestError(400, "malformed header")
        lowered, value = name.lower(), value.strip()
        has_body = has_body or _announces_body(lowered, value)
        if lowered == b"connection":
            keep_alive = b"close" not in value.lower() and (keep_alive or b"keep-alive" in value.lower())
    raise RequestError(431, "too many header fields")


def _announces_body(name: bytes, value: bytes) -> bool:
    if name == b"transfer-encoding":
        return True
    if name != b"content-length":
        return False
    if not value.isdigit():
        raise RequestError(400, "malformed Content-Length")
    return int(value) > 0


def _path_of(target: str) -> str:
    if target.startswith(("http://", "https://")):  # absolute-form: keep only the path
        target = "/" + target.split("://", 1)[1].partition("/")[2]
    return target.partition("?")[0].partition("#")[0]


def render_response(
    status: int,
    body: bytes,
    content_type: str,
    headers: dict[str, str],
    *,
    head: bool = False,
    keep_alive: bool = False,
) -> bytes:
    """The whole answer as bytes: status line, headers and (unless HEAD) the body."""
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        f"Connection: {'keep-alive' if keep_alive else 'close'}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    head_bytes = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head_bytes if head else head_bytes + body
