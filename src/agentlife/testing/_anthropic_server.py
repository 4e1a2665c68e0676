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

The script may also address turns by ``(step, call)``, answered by each request's
``x-agentlife-invocation`` header; `FakeModelServer` (shared with `FakeOpenAIServer`) describes it.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
import orjson

from agentlife._llm._anthropic import MessageAssembler
from agentlife._llm._scripted import ScriptedEvent, ScriptedTurn
from agentlife.testing._fake_server import FakeModelServer, FakeRequest, RateState

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["FakeAnthropicServer", "FakeRequest"]


class FakeAnthropicServer(FakeModelServer):
    """A scripted Anthropic Messages API on ``127.0.0.1``; use as ``async with``.

    Args:
        script: the turns to answer with: a list, one per request, in order (a string stands for
            ``ScriptedTurn.text(string)``; more can be added with `enqueue`), or a mapping
            ``{(step, call): turn}`` answered by each request's ``x-agentlife-invocation`` header. A
            request that finds no turn gets a 400 ``invalid_request_error`` saying so (never retried).
        api_key: when set, requests without this key (``x-api-key`` or ``Authorization: Bearer``) get a
            401, like the real API.
        host: the address to listen on (loopback by default).
        port: the port (0: any free one; read `base_url`).
        default_turn: the answer when the script has none for a request (None: the 400 above).
        on_request: called with each `FakeRequest` as it arrives.

    Attributes:
        requests: every request received, in order (``len(server.requests)`` counts them).
    """

    kind = "FakeAnthropicServer"

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self._handle)

    async def _respond(
        self, request: web.Request, turn: ScriptedTurn, body: Mapping[str, Any]
    ) -> web.StreamResponse:
        from aiohttp import web

        if turn.status != 200:
            return self._error(turn.status, turn.error_type, turn.error_message, turn.retry_after)
        if not turn.answer:
            return await self._stopping_response()
        events = turn.stream_events(model=str(body.get("model") or ""), messages=body.get("messages") or [])
        if not body.get("stream"):
            return await self._respond_whole(turn, events)
        response = web.StreamResponse(
            status=200,
            headers={
                "content-type": "text/event-stream",
                "cache-control": "no-cache",
                "request-id": "req_fake",
                **self._headers_for(request),
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
            return await self._stopping_response()
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

    def _error(
        self, status: int, error_type: str | None, message: str | None, retry_after: float | None
    ) -> web.StreamResponse:
        from aiohttp import web

        if error_type is None:
            error_type = {400: "invalid_request_error", 401: "authentication_error"}.get(status, "api_error")
        headers = {"request-id": "req_fake"}
        if retry_after is not None:
            headers["retry-after"] = f"{retry_after:g}" if math.isfinite(retry_after) else "0"
        if status == 529:
            headers["x-should-retry"] = "true"
        payload = {"type": "error", "error": {"type": error_type, "message": message or ""}}
        return web.json_response(payload, status=status, headers=headers)

    def _rate_headers(self, states: list[RateState]) -> dict[str, str]:
        """``anthropic-ratelimit-{requests,input-tokens,output-tokens}-{limit,remaining,reset}``."""
        now = dt.datetime.now(dt.UTC)
        headers: dict[str, str] = {}
        for state in states:
            reset = now + dt.timedelta(seconds=math.ceil(state.reset_seconds))
            prefix = f"anthropic-ratelimit-{state.name}"
            headers[f"{prefix}-limit"] = str(state.limit)
            headers[f"{prefix}-remaining"] = str(state.remaining)
            headers[f"{prefix}-reset"] = reset.strftime("%Y-%m-%dT%H:%M:%SZ")
        return headers

    def _rate_limited(
        self, states: list[RateState], wait: float, body: Mapping[str, Any]
    ) -> web.StreamResponse:
        """Anthropic's 429: ``rate_limit_error``, ``retry-after`` in whole seconds, the rate-limit headers."""
        from aiohttp import web

        headers = {
            "request-id": "req_fake",
            "retry-after": str(max(1, math.ceil(wait))),
            **self._rate_headers(states),
        }
        message = (
            "This request would exceed your organization's rate limit. For details, refer to: "
            "https://docs.claude.com/en/api/rate-limits."
        )
        payload = {"type": "error", "error": {"type": "rate_limit_error", "message": message}}
        return web.json_response(payload, status=429, headers=headers)


def _sse(event: Mapping[str, Any]) -> bytes:
    name = str(event.get("type", "message")).encode()
    return b"event: " + name + b"\ndata: " + orjson.dumps(event) + b"\n\n"
