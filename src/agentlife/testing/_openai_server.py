"""`FakeOpenAIServer`: a real HTTP server that speaks the streaming Chat Completions API, for tests.

It listens on ``127.0.0.1`` (any free port) and answers ``POST /v1/chat/completions`` (and
``/chat/completions``) with the next `ScriptedTurn`, the very turns `FakeAnthropicServer` and `ScriptedLLM`
play, translated to ``chat.completion.chunk`` objects sent as ``data:`` lines and ended by
``data: [DONE]``: text deltas as ``content``, thinking as ``reasoning_content``, tool calls as
``tool_calls`` deltas with JSON-string ``arguments``, the stop reason as ``finish_reason`` and, when the
request asks ``stream_options.include_usage``, a final usage chunk. Pings become SSE comments
(``: keep-alive``), which is what OpenAI-compatible servers send while a model thinks. Errors are
``{"error": {...}}`` bodies with a ``retry-after`` header when the turn has one.

Point `agentlife.OpenAICompatibleLLM`, the ``openai`` SDK or your agent (``AGENTLIFE_LLM_PROVIDER=openai``,
``OPENAI_BASE_URL``) at ``server.base_url`` (it ends in ``/v1``)::

    async with FakeOpenAIServer([ScriptedTurn.stall(after_chunks=2)]) as server:
        llm = OpenAICompatibleLLM(server.base_url, api_key="test-key")
        ...
        await server.wait_for_disconnects(1)   # the client really closed the connection
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import orjson

from agentlife._llm._scripted import ScriptedEvent, ScriptedTurn
from agentlife.testing._fake_server import FakeModelServer, RateState

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["FakeOpenAIServer", "chat_chunks"]

#: Anthropic ``stop_reason`` to the ``finish_reason`` an OpenAI-compatible server sends.
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_api_key",
    403: "permission_denied",
    404: "not_found",
    429: "rate_limit_exceeded",
}
KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"


class FakeOpenAIServer(FakeModelServer):
    """A scripted OpenAI-compatible Chat Completions API on ``127.0.0.1``; use as ``async with``.

    Args:
        script: the turns to answer with: a list, one per request, in order (a string stands for
            ``ScriptedTurn.text(string)``; more with `enqueue`), or a mapping ``{(step, call): turn}``
            answered by each request's ``x-agentlife-invocation`` header. A request that finds no turn
            gets a 400 saying so (never retried). ``ScriptedTurn.error`` turns cannot be sent.
        api_key: when set, requests without ``Authorization: Bearer <api_key>`` get a 401.
        host: the address to listen on (loopback by default).
        port: the port (0: any free one; read `base_url`).
        default_turn: the answer when the script has none for a request (None: the 400 above).
        on_request: called with each `FakeRequest` as it arrives.

    Attributes:
        requests: every request received, in order (``len(server.requests)`` counts them).
    """

    kind = "FakeOpenAIServer"
    url_suffix = "/v1"

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/chat/completions", self._handle)

    async def _respond(
        self, request: web.Request, turn: ScriptedTurn, body: Mapping[str, Any]
    ) -> web.StreamResponse:
        from aiohttp import web

        if turn.status != 200:
            return self._error(turn.status, turn.error_type, turn.error_message, turn.retry_after)
        if not turn.answer:
            return await self._stopping_response()
        if not body.get("stream"):
            return self._error(400, None, "FakeOpenAIServer answers stream: true requests only", None)
        model = str(body.get("model") or "")
        events = turn.stream_events(model=model, messages=body.get("messages") or [])
        options = body.get("stream_options")
        usage = isinstance(options, Mapping) and bool(options.get("include_usage"))
        response = web.StreamResponse(
            status=200,
            headers={
                "content-type": "text/event-stream",
                "cache-control": "no-cache",
                "x-request-id": "req_fake",
                **self._headers_for(request),
            },
        )
        await response.prepare(request)
        for delay, data in chat_chunks(events, model=turn.model or model, include_usage=usage):
            if delay > 0:
                await anyio.sleep(delay)
            await response.write(data)
        if turn.after == "stall":
            await self._hang()
        elif turn.after == "trickle":
            while not self._is_stopping():
                await anyio.sleep(turn.trickle_interval)
                await response.write(KEEPALIVE)
        await response.write_eof()
        return response

    def _rate_headers(self, states: list[RateState]) -> dict[str, str]:
        """``x-ratelimit-{limit,remaining}-{requests,tokens}`` and ``x-ratelimit-reset-{requests,tokens}``."""
        headers: dict[str, str] = {}
        for state in states:
            name = {"requests": "requests", "input-tokens": "tokens"}.get(state.name)
            if name is None:  # OpenAI reports one token limit: the input tokens' here
                continue
            headers[f"x-ratelimit-limit-{name}"] = str(state.limit)
            headers[f"x-ratelimit-remaining-{name}"] = str(state.remaining)
            headers[f"x-ratelimit-reset-{name}"] = _duration(state.reset_seconds)
        return headers

    def _rate_limited(
        self, states: list[RateState], wait: float, body: Mapping[str, Any]
    ) -> web.StreamResponse:
        """OpenAI's 429: ``rate_limit_exceeded`` with the limit that was hit, and the rate-limit headers."""
        from aiohttp import web

        state = min(states, key=lambda s: s.remaining / s.limit)
        unit = "requests per min (RPM)" if state.name == "requests" else "tokens per min (TPM)"
        model = str(body.get("model") or "the model")[:100]
        message = (
            f"Rate limit reached for {model} in organization org-fake on {unit}: Limit {state.limit}, "
            f"Used {state.limit - state.remaining}, Requested 1. Please try again in {_duration(wait)}. "
            "Visit https://platform.openai.com/account/rate-limits to learn more."
        )
        kind = "requests" if state.name == "requests" else "tokens"
        headers = {
            "x-request-id": "req_fake",
            "retry-after": str(max(1, math.ceil(wait))),
            **self._rate_headers(states),
        }
        payload = {"error": {"message": message, "type": kind, "param": None, "code": "rate_limit_exceeded"}}
        return web.json_response(payload, status=429, headers=headers)

    def _error(
        self, status: int, error_type: str | None, message: str | None, retry_after: float | None
    ) -> web.StreamResponse:
        from aiohttp import web

        headers = {"x-request-id": "req_fake"}
        if retry_after is not None:
            headers["retry-after"] = f"{retry_after:g}" if math.isfinite(retry_after) else "0"
        kind = (
            error_type
            if error_type and status not in _ERROR_TYPES
            else _ERROR_TYPES.get(status, "server_error")
        )
        payload = {"error": {"message": message or "", "type": kind, "param": None, "code": kind}}
        return web.json_response(payload, status=status, headers=headers)


def _duration(seconds: float) -> str:
    """OpenAI's reset duration: ``20ms``, ``1s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


def chat_chunks(
    events: tuple[ScriptedEvent, ...], *, model: str, include_usage: bool = True
) -> Iterator[tuple[float, bytes]]:
    """Translate a turn's Messages API events into ``(delay, SSE bytes)`` of Chat Completions chunks.

    ``message_stop`` ends the stream with the usage chunk (if asked) and ``data: [DONE]``; a turn that
    stalls or trickles has no ``message_stop``, so its stream stays open. The pause before an event that
    has no chunk of its own (``content_block_stop``, ``signature_delta``) moves to the next chunk.
    """
    state = _Translation(model, include_usage)
    carried = 0.0
    for scripted in events:
        carried += scripted.delay
        for data in state.translate(scripted.event):
            yield carried, data
            carried = 0.0


class _Translation:
    """The state of one turn's translation: tool call indexes and the usage to report at the end."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.model = model
        self.include_usage = include_usage
        self.tools: dict[int, int] = {}  # content block index -> tool call index
        self.input_tokens = self.output_tokens = self.cached = 0

    def chunk(self, delta: Mapping[str, Any] | None, finish: str | None = None, **extra: Any) -> bytes:
        payload: dict[str, Any] = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": self.model,
            "choices": [] if delta is None else [{"index": 0, "delta": dict(delta), "finish_reason": finish}],
            **extra,
        }
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    def translate(self, event: Mapping[str, Any]) -> list[bytes]:
        kind = event.get("type")
        if kind == "message_start":
            usage = (event.get("message") or {}).get("usage") or {}
            self.input_tokens = int(usage.get("input_tokens") or 0)
            self.cached = int(usage.get("cache_read_input_tokens") or 0)
            return [self.chunk({"role": "assistant", "content": ""})]
        if kind == "ping":
            return [KEEPALIVE]
        if kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") != "tool_use":
                return []
            index = self.tools[int(event.get("index", 0))] = len(self.tools)
            function = {"name": block.get("name"), "arguments": ""}
            return [
                self.chunk(
                    {
                        "tool_calls": [
                            {"index": index, "id": block.get("id"), "type": "function", "function": function}
                        ]
                    }
                )
            ]
        if kind == "content_block_delta":
            return self._delta(int(event.get("index", 0)), event.get("delta") or {})
        if kind == "message_delta":
            reason = str((event.get("delta") or {}).get("stop_reason") or "end_turn")
            self.output_tokens = int((event.get("usage") or {}).get("output_tokens") or 0)
            return [self.chunk({}, _FINISH.get(reason, reason))]
        if kind == "message_stop":
            out = []
            if self.include_usage:
                prompt = self.input_tokens + self.cached
                usage = {
                    "prompt_tokens": prompt,
                    "completion_tokens": self.output_tokens,
                    "total_tokens": prompt + self.output_tokens,
                    "prompt_tokens_details": {"cached_tokens": self.cached},
                }
                out.append(self.chunk(None, usage=usage))
            return [*out, DONE]
        return []

    def _delta(self, index: int, delta: Mapping[str, Any]) -> list[bytes]:
        kind = delta.get("type")
        if kind == "text_delta":
            return [self.chunk({"content": delta.get("text", "")})]
        if kind == "thinking_delta":
            return [self.chunk({"reasoning_content": delta.get("thinking", "")})]
        if kind == "input_json_delta":
            call = {
                "index": self.tools.get(index, 0),
                "function": {"arguments": delta.get("partial_json", "")},
            }
            return [self.chunk({"tool_calls": [call]})]
        return []
