"""`FakeAnthropicServer`: a real HTTP server that speaks the streaming Messages API, for tests.

It listens on ``127.0.0.1`` (any free port), answers ``POST /v1/messages`` with the next scripted
`ScriptedTurn` as Server-Sent Events (``event: ...`` / ``data: {...}``), and records what happened: the
requests it got and which of them the client hung up on. Point the real ``anthropic`` SDK, or
`agentlife.AnthropicLLM`, or your agent (``ANTHROPIC_BASE_URL``) at ``server.base_url``::

    from agentlife import ScriptedTurn
    from agentlife.testing import FakeAnthropicServer

    async with FakeAnthropicServer([ScriptedTurn.stall(after_chunks=2)]) as server:
        llm = AnthropicLLM(api_key="test-key", base_url=server.base_url)
        with pytest.raises(LLMTimeout):
            await llm.complete(model="claude-sonnet-4-5", messages=[...], max_tokens=100,
                               timeouts=StreamTimeouts(connect=1, chunk=0.2, total=5))
        await server.wait_for_disconnects(1)   # the client really closed the connection

Every behaviour a stream guard must survive is one helper away: a normal stream, thinking with pings,
tool use, a stall mid-response, a long thinking pause with pings, accept-and-never-answer, a trickle of
pings forever, and HTTP errors (429 with ``retry-after``, 529, 500, 400, 401 ...). aiohttp is imported
when the server starts, not when `agentlife.testing` is imported.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import orjson

from agentlife._anthropic import MessageAssembler
from agentlife._scripted import ScriptedEvent, ScriptedTurn

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["FakeAnthropicServer", "FakeRequest"]

_SECRET_HEADERS = frozenset({"x-api-key", "authorization", "proxy-authorization"})


@dataclass(frozen=True, slots=True)
class FakeRequest:
    """One request the fake server received.

    Attributes:
        number: its position, from 0.
        path: the URL path (``/v1/messages``).
        headers: the request headers, lower-cased, with credentials replaced by ``***``.
        body: the JSON body (model, messages, max_tokens, stream ...).
    """

    number: int
    path: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: Mapping[str, Any] = field(default_factory=dict)


class FakeAnthropicServer:
    """A scripted Anthropic Messages API on ``127.0.0.1``; use as ``async with``.

    Args:
        script: the turns to answer with, one per request, in order; a string stands for
            ``ScriptedTurn.text(string)``. More can be added with `enqueue`. A request that finds the
            script empty gets a 400 ``invalid_request_error`` saying so (never retried).
        api_key: when set, requests without this key (``x-api-key`` or ``Authorization: Bearer``) get a
            401, like the real API.
        host: the address to listen on (loopback by default).
        port: the port (0: any free one; read `base_url`).

    Attributes:
        requests: every request received, in order (``len(server.requests)`` counts them).
    """

    def __init__(
        self,
        script: Iterable[ScriptedTurn | str] = (),
        *,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.requests: list[FakeRequest] = []
        self._script: list[ScriptedTurn] = []
        self._api_key = api_key
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self._disconnected: list[int] = []
        self._completed: list[int] = []
        # Made in start(): older anyio versions need a running event loop to create an Event.
        self._changed: anyio.Event | None = None
        self._stopping: anyio.Event | None = None
        self.enqueue(*script)

    # --- lifecycle --------------------------------------------------------------------------------

    async def __aenter__(self) -> FakeAnthropicServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Start listening (`base_url` is valid afterwards)."""
        if self._runner is not None:
            raise RuntimeError("FakeAnthropicServer is already started")
        from aiohttp import web

        self._changed, self._stopping = anyio.Event(), anyio.Event()
        app = web.Application()
        app.router.add_post("/v1/messages", self._handle)
        # handler_cancellation: a client that hangs up cancels its handler, which is how we see it go.
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        await site.start()
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    async def close(self) -> None:
        """Stop: hanging responses end, connections close (idempotent)."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        assert self._stopping is not None
        self._stopping.set()
        with anyio.move_on_after(5.0, shield=True):
            await runner.cleanup()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``, for ``ANTHROPIC_BASE_URL`` or ``base_url=``."""
        if self._runner is None:
            raise RuntimeError("FakeAnthropicServer is not started")
        return f"http://{self._host}:{self._port}"

    # --- script and observations ------------------------------------------------------------------

    def enqueue(self, *turns: ScriptedTurn | str) -> None:
        """Append turns to the script (one per future request)."""
        for turn in turns:
            turn = ScriptedTurn.text(turn) if isinstance(turn, str) else turn
            if turn.exception is not None:
                raise TypeError(
                    "ScriptedTurn.error() cannot be sent over HTTP; use ScriptedTurn.http_error()"
                )
            self._script.append(turn)

    @property
    def pending(self) -> int:
        """How many scripted turns are still unused."""
        return len(self._script)

    @property
    def disconnects(self) -> int:
        """How many responses the client abandoned before they were complete (it closed the connection)."""
        return len(self._disconnected)

    @property
    def disconnected_requests(self) -> tuple[int, ...]:
        """The numbers of the requests whose client hung up, in the order it happened."""
        return tuple(self._disconnected)

    @property
    def completed(self) -> int:
        """How many responses were sent in full."""
        return len(self._completed)

    async def wait_for_disconnects(self, count: int = 1, *, timeout: float = 5.0) -> None:
        """Wait until at least ``count`` clients hung up.

        Raises:
            TimeoutError: not within ``timeout`` seconds.
        """
        await self._wait_until(lambda: len(self._disconnected) >= count, timeout)

    async def wait_for_requests(self, count: int = 1, *, timeout: float = 5.0) -> None:
        """Wait until at least ``count`` requests arrived.

        Raises:
            TimeoutError: not within ``timeout`` seconds.
        """
        await self._wait_until(lambda: len(self.requests) >= count, timeout)

    async def _wait_until(self, condition: Callable[[], bool], timeout: float) -> None:
        with anyio.fail_after(timeout):
            while not condition():
                if self._changed is None:
                    raise RuntimeError("FakeAnthropicServer is not started")
                await self._changed.wait()

    def _notify(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        if changed is not None:
            changed.set()

    def _is_stopping(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    # --- serving ----------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        number = len(self.requests)
        body = await _json_body(request)
        self.requests.append(FakeRequest(number, request.path, _safe_headers(request.headers), body))
        self._notify()
        try:
            if self._api_key is not None and not _authenticated(request.headers, self._api_key):
                return _error_response(401, "authentication_error", "invalid x-api-key", None)
            if not self._script:
                message = f"FakeAnthropicServer: no scripted turn left for request #{number}"
                return _error_response(400, "invalid_request_error", message, None)
            turn = self._script.pop(0)
            response = await self._respond(request, turn, body)
        except (asyncio.CancelledError, ConnectionError):
            if not self._is_stopping():
                self._disconnected.append(number)
                self._notify()
            raise
        self._completed.append(number)
        self._notify()
        return response

    async def _respond(
        self, request: web.Request, turn: ScriptedTurn, body: Mapping[str, Any]
    ) -> web.StreamResponse:
        from aiohttp import web

        if turn.status != 200:
            return _error_response(turn.status, turn.error_type, turn.error_message, turn.retry_after)
        if not turn.answer:
            await self._hang()
            return web.Response(status=503, text="FakeAnthropicServer is stopping")
        events = turn.stream_events(model=str(body.get("model") or ""), messages=body.get("messages") or [])
        if not body.get("stream"):
            return await self._respond_whole(turn, events)
        response = web.StreamResponse(
            status=200,
            headers={
                "content-type": "text/event-stream",
                "cache-control": "no-cache",
                "request-id": "req_fake",
            },
        )
        await response.prepare(request)
        for scripted in events:
            if scripted.delay > 0:
                await anyio.sleep(scripted.delay)
            await response.write(_sse(scripted.event))
        if turn.after == "stall":
            await self._hang()
        elif turn.after == "trickle":
            while not self._is_stopping():
                await anyio.sleep(turn.trickle_interval)
                await response.write(_sse({"type": "ping"}))
        await response.write_eof()
        return response

    async def _respond_whole(
        self, turn: ScriptedTurn, events: tuple[ScriptedEvent, ...]
    ) -> web.StreamResponse:
        """A non-streaming request gets the whole message once the stream would have finished."""
        from aiohttp import web

        await anyio.sleep(sum(e.delay for e in events))
        if turn.after != "end":
            await self._hang()
            return web.Response(status=503, text="FakeAnthropicServer is stopping")
        assembler = MessageAssembler()
        for scripted in events:
            assembler.feed(scripted.event)
        reply = assembler.reply()
        message = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": reply.model,
            "content": [dict(block) for block in reply.content],
            "stop_reason": reply.stop_reason,
            "stop_sequence": None,
            "usage": reply.usage.to_json(),
        }
        return web.json_response(message)

    async def _hang(self) -> None:
        """Keep the connection open and silent until the client leaves (cancelling us) or the server stops."""
        assert self._stopping is not None
        await self._stopping.wait()


def _error_response(
    status: int, error_type: str | None, message: str | None, retry_after: float | None
) -> web.StreamResponse:
    from aiohttp import web

    headers = {"request-id": "req_fake"}
    if retry_after is not None:
        headers["retry-after"] = f"{retry_after:g}" if math.isfinite(retry_after) else "0"
    if status == 529:
        headers["x-should-retry"] = "true"
    payload = {"type": "error", "error": {"type": error_type or "api_error", "message": message or ""}}
    return web.json_response(payload, status=status, headers=headers)


def _sse(event: Mapping[str, Any]) -> bytes:
    name = str(event.get("type", "message")).encode()
    return b"event: " + name + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def _authenticated(headers: Mapping[str, str], api_key: str) -> bool:
    # The SDKs send the key as x-api-key or, in newer versions, as a bearer token.
    return headers.get("x-api-key") == api_key or headers.get("authorization") == f"Bearer {api_key}"


def _safe_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): ("***" if k.lower() in _SECRET_HEADERS else v) for k, v in headers.items()}


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}
