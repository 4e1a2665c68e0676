"""What both model adapters read off an HTTP response, bounded: its Server-Sent Events and its error body.

The Anthropic and the OpenAI-compatible adapters stream their replies as Server-Sent Events, over httpx or
over agentlife's loopback client, and read the body of an error status for the server's explanation. Both
readers are here once, so the adapters and their transports cannot drift apart:

* `server_sent_events` decodes the events from the response's bytes. Lines end at LF, CR and CRLF only, as
  the SSE format says: a U+2028, U+0085 or form feed inside a JSON string is text. (httpx's
  ``aiter_lines`` splits where ``str.splitlines`` does, at those too, and so cut such an event into two
  halves that are not JSON.) A line that arrives across many TCP writes is gathered at a cost linear in
  its length (`agentlife._llm._loopback_http.split_lines`), and a line or an event's data past
  `MAX_EVENT_BYTES` is refused rather than held.
* `read_error_body` reads at most `MAX_ERROR_BODY_BYTES` of an error's body, for at most
  `ERROR_BODY_SECONDS`: the API's JSON error is small, a proxy's page is not worth more, and a body that
  trickles must not turn the status it came with into a timeout.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import anyio

from agentlife._exceptions import PermanentError, describe_error
from agentlife._llm._loopback_http import LineTooLong, split_lines

__all__ = [
    "COMMENT",
    "ERROR_BODY_SECONDS",
    "MAX_ERROR_BODY_BYTES",
    "MAX_EVENT_BYTES",
    "ServerSentEvent",
    "read_error_body",
    "server_sent_events",
]

_log = logging.getLogger("agentlife.llm")

#: The longest line, and the most data one event may gather (in characters, each at least a byte).
MAX_EVENT_BYTES = 32 * 1024 * 1024
#: The most of an error status's body read for its message.
MAX_ERROR_BODY_BYTES = 64 * 1024
#: The longest an error status's body is read for; what arrived by then is what the message uses.
ERROR_BODY_SECONDS = 5.0
_BOM = "\ufeff"


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One event of a stream: its ``data`` lines joined by LF, and its ``event`` field when it had one."""

    data: str | None
    """The event's data; None for a comment line (``: keep-alive``), which is progress and nothing else."""
    name: str | None = None
    """The ``event:`` field (the Messages API names each event's type there)."""


#: What `server_sent_events` yields for a comment line.
COMMENT = ServerSentEvent(None)


class _EventTooLarge(Exception):
    """An event's data lines passed `MAX_EVENT_BYTES` before the blank line that ends it."""


async def server_sent_events(response: Any, api: str) -> AsyncGenerator[ServerSentEvent, None]:
    """The events of a streaming response (httpx's, the loopback client's or the SDK's), comments included.

    Args:
        response: has ``aiter_bytes()``.
        api: what the stream is, for the error (``"Anthropic"``, ``"OpenAI-compatible"``).

    Raises:
        PermanentError: a line or an event passed `MAX_EVENT_BYTES` without an end: no model API sends
            that, and the next try would get the same.
    """
    try:
        # Each layer closed here, not left to the garbage collector (a wake-up of the loop and a task each).
        async with (
            aclosing(response.aiter_bytes()) as pieces,
            aclosing(split_lines(pieces, MAX_EVENT_BYTES)) as lines,
            aclosing(_events(lines)) as events,
        ):
            async for event in events:
                yield event
    except (LineTooLong, _EventTooLarge):
        raise PermanentError(
            f"the {api} stream sent an event over {MAX_EVENT_BYTES // (1024 * 1024)} MiB without an end: "
            "not a stream a model API sends"
        ) from None


async def _events(lines: AsyncIterator[str]) -> AsyncGenerator[ServerSentEvent, None]:
    name: str | None = None
    data: list[str] = []
    size = 0
    first = True
    async for line in lines:
        if first:
            line, first = line.removeprefix(_BOM), False  # the format allows one before the first line
        if not line:
            if data:
                yield ServerSentEvent("\n".join(data), name)
            name, data, size = None, [], 0
        elif line.startswith(":"):
            yield COMMENT
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                size += len(value) + 1
                if size > MAX_EVENT_BYTES:
                    raise _EventTooLarge
                data.append(value)
    if data:
        yield ServerSentEvent("\n".join(data), name)


async def read_error_body(response: Any) -> bytes:
    """At most `MAX_ERROR_BODY_BYTES` of an error response's body, read for at most `ERROR_BODY_SECONDS`.

    What arrived before the limit, the time or a failure of the connection (the status still says what
    happened); the rest is never read.
    """
    body = bytearray()
    with anyio.move_on_after(ERROR_BODY_SECONDS):
        try:
            async with aclosing(response.aiter_bytes()) as pieces:
                async for piece in pieces:
                    body += piece
                    if len(body) >= MAX_ERROR_BODY_BYTES:
                        break
        except Exception as exc:  # a body cut off
            _log.debug("reading an error body failed: %s", describe_error(exc))
    return bytes(body[:MAX_ERROR_BODY_BYTES])
