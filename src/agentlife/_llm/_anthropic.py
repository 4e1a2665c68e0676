"""The Anthropic adapter: `AnthropicLLM`, streaming through the progress guard.

By default the request goes over plain HTTP (`agentlife._llm._messages_http`, httpx): a streaming
``POST /v1/messages`` with the headers the SDK sends, without paying two to three seconds of
``import anthropic``. An ``anthropic.AsyncAnthropic`` client passed as ``client=`` is used instead (with
``max_retries=0``), for its own configuration: a custom httpx client, proxies, Bedrock or Vertex. Either
way agentlife retries, inside the step and run budgets, and reads the raw Server-Sent Events itself,
because the SDK's event iterator drops ``ping`` events and a long extended-thinking pause is *only* pings:
the inter-chunk clock must see them. Every event passes through `guard_stream`, which closes the HTTP
response on a timeout or a cancellation, so the server sees the disconnect at once.

The stream is assembled into an `LLMReply` whose ``content`` keeps every block in API form (``text``,
``thinking`` with its ``signature``, ``redacted_thinking``, ``tool_use`` with ``input`` parsed from the
JSON deltas), so a reply can be sent back as the assistant turn of the next request unchanged. A tool
input that cannot be read as the model's arguments (cut off by ``max_tokens``, not JSON, not an object)
becomes ``{}`` in the block and is named in ``LLMReply.tool_input_errors``, so nothing runs on it.

A ``200`` that is not ``text/event-stream`` (a proxy's HTML page, a JSON body) is a `PermanentError`
naming the content type at once: retrying cannot turn it into a stream.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from typing import Any

import orjson

from agentlife._exceptions import (
    CallError,
    LLMConfigurationError,
    PermanentError,
    TransientError,
    describe_error,
)
from agentlife._llm._guard import guard_stream, stream_timeouts_from_env
from agentlife._llm._messages_http import (
    MessagesHTTP,
    ResponseHolder,
    checked_events,
    error_details,
    error_for_event,
    error_for_status,
    not_a_stream,
    parse_retry_after,
    sse_events,
)
from agentlife._llm._pricing import PriceTable
from agentlife._llm._protocol import (
    CURRENT_CALL,
    CUT_OFF,
    INVOCATION_HEADER,
    LLMReply,
    OnEvent,
    StreamEvent,
    StreamTimeouts,
    Usage,
    cut_off_tool_use,
    json_kind,
    stream_event,
)
from agentlife._llm._ratelimit_headers import response_seen
from agentlife._redact import Redactor, url_password

__all__ = [
    "AnthropicLLM",
    "MessageAssembler",
    "anthropic_stream_event",
    "collect_reply",
    "error_for_event",
    "error_for_status",
    "parse_retry_after",
    "sse_events",
]

_log = logging.getLogger("agentlife.llm")

_NO_KEY = (
    "ANTHROPIC_API_KEY is not set: export it (and ANTHROPIC_BASE_URL for a proxy), pass api_key= to "
    "AnthropicLLM, or return a ScriptedLLM from make_llm() to run without a model"
)


# --- assembling a reply ---------------------------------------------------------------------------------


class MessageAssembler:
    """Builds an `LLMReply` from Messages API stream events (dicts), in the order they arrive.

    ``message_start`` gives the model and the input usage; ``content_block_start/delta/stop`` build the
    blocks (``text_delta``, ``thinking_delta``, ``signature_delta``, ``input_json_delta``,
    ``citations_delta``); ``message_delta`` the stop reason and the output usage; ``ping`` and unknown
    events are ignored; an ``error`` event raises the matching agentlife error (`error_for_event`).
    """

    def __init__(self, model: str = "") -> None:
        self.model = model
        self.message_id: str | None = None
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.stopped = False
        self._usage: dict[str, int] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        # Text, thinking and tool-input deltas are gathered as lists and joined once at block stop.
        self._parts: dict[int, list[str]] = {}
        # Block index -> why its tool input is unusable (a delta that was not text, JSON that does not parse).
        self._input_errors: dict[int, str] = {}

    def feed(self, event: Mapping[str, Any]) -> None:
        """Take one stream event into account."""
        kind = event.get("type")
        if kind == "content_block_delta":
            self._delta(int(event.get("index", 0)), event.get("delta") or {})
        elif kind == "content_block_start":
            self._start_block(int(event.get("index", 0)), event.get("content_block") or {})
        elif kind == "content_block_stop":
            self._finish_block(int(event.get("index", 0)))
        elif kind == "message_start":
            message = event.get("message") or {}
            self.model = str(message.get("model") or self.model)
            self.message_id = message.get("id")
            self._merge_usage(message.get("usage"))
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            self.stop_reason = delta.get("stop_reason", self.stop_reason)
            self.stop_sequence = delta.get("stop_sequence", self.stop_sequence)
            self._merge_usage(event.get("usage"))
        elif kind == "message_stop":
            self.stopped = True
        elif kind == "error":
            raise error_for_event(event.get("error") or {})

    def reply(self, prices: PriceTable | None = None) -> LLMReply:
        """The whole reply; its ``cost_usd`` from ``prices`` (0 without a table).

        Raises:
            TransientError: the stream ended without ``message_stop`` (a dropped connection).
        """
        if not self.stopped:
            raise TransientError("the model's stream ended before message_stop (connection dropped?)")
        for index in list(self._parts):
            self._finish_block(index)
        content = tuple(
            {key: value for key, value in self._blocks[index].items() if value is not None}
            for index in sorted(self._blocks)
        )
        text = "".join(block.get("text", "") for block in content if block.get("type") == "text")
        usage = Usage.from_json(self._usage)
        cost = prices.cost_usd(self.model, usage) if prices is not None else 0.0
        return LLMReply(
            text=text,
            content=content,
            usage=usage,
            stop_reason=self.stop_reason,
            model=self.model,
            cost_usd=cost,
            tool_input_errors=self._tool_input_errors(content),
        )

    def _tool_input_errors(self, content: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        errors: dict[str, str] = {}
        cut = cut_off_tool_use(content, self.stop_reason)
        if cut is not None:
            errors[cut] = CUT_OFF
        for index, problem in self._input_errors.items():
            block = self._blocks.get(index)
            if block is not None and block.get("type") == "tool_use":
                errors.setdefault(str(block.get("id", "")), problem)
        for use_id in errors:
            _log.debug("tool_use %s: %s", use_id, errors[use_id])
        return errors

    def _start_block(self, index: int, block: Mapping[str, Any]) -> None:
        started = dict(block)
        kind = started.get("type")
        if kind == "text":
            self._parts[index] = [str(started.get("text") or "")]
        elif kind == "thinking":
            self._parts[index] = [str(started.get("thinking") or "")]
        elif "input" in started:
            # tool_use, server_tool_use, mcp_tool_use: the input arrives as JSON text deltas.
            self._parts[index] = []
        self._blocks[index] = started

    def _delta(self, index: int, delta: Mapping[str, Any]) -> None:
        kind = delta.get("type")
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        parts = self._parts.setdefault(index, [])
        if kind == "text_delta":
            parts.append(str(delta.get("text", "")))
        elif kind == "thinking_delta":
            parts.append(str(delta.get("thinking", "")))
        elif kind == "input_json_delta":
            partial = delta.get("partial_json", "")
            if isinstance(partial, str):
                parts.append(partial)
            else:
                self._input_errors.setdefault(
                    index,
                    f"its input arrived as JSON {json_kind(partial)}, not as the JSON text the API sends",
                )
        elif kind == "signature_delta":
            block["signature"] = str(block.get("signature") or "") + str(delta.get("signature", ""))
        elif kind == "citations_delta":
            citations = block.get("citations") or []
            block["citations"] = [*citations, delta.get("citation")]

    def _finish_block(self, index: int) -> None:
        parts = self._parts.pop(index, None)
        block = self._blocks.get(index)
        if parts is None or block is None:
            return
        joined = "".join(parts)
        kind = block.get("type")
        if kind == "text":
            block["text"] = joined
        elif kind == "thinking":
            block["thinking"] = joined
        elif "input" in block:
            block["input"], problem = _parse_tool_input(joined, block)
            if problem is not None:
                self._input_errors.setdefault(index, problem)

    def _merge_usage(self, usage: Any) -> None:
        if not isinstance(usage, Mapping):
            return
        for key, value in usage.items():
            # message_delta repeats some counts as null; only real numbers update the totals.
            if isinstance(value, int) and not isinstance(value, bool):
                self._usage[key] = value


def _parse_tool_input(raw: str, block: Mapping[str, Any]) -> tuple[Any, str | None]:
    """A tool block's input from its JSON text, and why it cannot be used (None when it can)."""
    if not raw.strip():
        start = block.get("input")
        return (start, None) if isinstance(start, Mapping) else ({}, "its input is not a JSON object")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # Cut off by max_tokens, or broken: {} keeps the block sendable, the error keeps it from running.
        return {}, f"its input is not valid JSON ({exc}, {len(raw)} characters)"
    if not isinstance(value, dict):
        return {}, f"its input is JSON {json_kind(value)}, not an object"
    return value, None


def anthropic_stream_event(event: Mapping[str, Any]) -> StreamEvent:
    """Classify one Messages API stream event."""
    # Runs once per chunk of ``ctx.llm.stream``: the exact-type checks skip the slower ABC check and
    # ``str()`` for what the wire gives (dicts and strings).
    if event.get("type") == "content_block_delta":
        delta = event.get("delta")
        if type(delta) is dict or isinstance(delta, Mapping):
            kind = delta.get("type")
            if kind == "text_delta":
                text = delta.get("text", "")
                return stream_event("text", text if type(text) is str else str(text), event)
            if kind == "thinking_delta":
                thinking = delta.get("thinking", "")
                return stream_event("thinking", thinking if type(thinking) is str else str(thinking), event)
    return stream_event("other", "", event)


async def collect_reply(
    source: AsyncIterator[Mapping[str, Any]],
    timeouts: StreamTimeouts,
    *,
    close: Callable[[], Awaitable[None]] | None = None,
    prices: PriceTable | None = None,
    model: str = "",
    on_event: OnEvent | None = None,
) -> LLMReply:
    """Read a stream of Messages API events under ``timeouts`` and assemble the reply.

    This is the loop both `AnthropicLLM` and `agentlife.ScriptedLLM` run, so scripted replies time out
    exactly like real ones. ``on_event`` sees every event but pings, as it arrives.
    """
    assembler = MessageAssembler(model)
    async with aclosing(guard_stream(source, timeouts, close=close)) as stream:
        async for event in stream:
            assembler.feed(event)
            if on_event is not None and event.get("type") != "ping":
                on_event(anthropic_stream_event(event))
    return assembler.reply(prices)


# --- the adapter ------------------------------------------------------------------------------------


class AnthropicLLM:
    """`LLMClient` for the Anthropic Messages API, streamed through the progress guard.

    Args:
        api_key: the API key; None reads ``ANTHROPIC_API_KEY``. Without one, the first `complete`
            raises `LLMConfigurationError` (constructing the client never fails for that).
        base_url: the API root; None reads ``ANTHROPIC_BASE_URL`` (a proxy, or a `FakeAnthropicServer`),
            and without it ``https://api.anthropic.com``.
        prices: the price table for ``LLMReply.cost_usd`` (default `PriceTable.default`).
        http_timeout: the HTTP client's own timeout in seconds, a backstop behind the stream guard;
            None keeps the SDK's default (600 s, 5 s to connect).
        timeouts: the stream timeouts used when `complete` gets none; None reads
            ``AGENTLIFE_LLM_*_TIMEOUT_SECONDS`` (their defaults are `CallConstants`').
        env: where to read the variables above (default `os.environ`).
        client: an ``anthropic.AsyncAnthropic`` (or another async client of the ``anthropic`` SDK) to send
            the requests instead of agentlife's own HTTP client. It is used as
            ``client.with_options(max_retries=0)``, with its own key, base URL and HTTP settings; it stays
            yours to close. None (the default) sends them with httpx and never imports ``anthropic``.

    Example:
        >>> llm = AnthropicLLM(api_key="sk-ant-test", base_url="http://127.0.0.1:8080")
        >>> llm
        AnthropicLLM(base_url='http://127.0.0.1:8080', api_key='***')
    """

    streams_events = True
    #: ``gen_ai.provider.name`` of its calls, and its row in `agentlife._providers.PROVIDERS`.
    provider = "anthropic"

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        prices: PriceTable | None = None,
        http_timeout: float | None = None,
        timeouts: StreamTimeouts | None = None,
        env: Mapping[str, str] | None = None,
        client: Any = None,
    ) -> None:
        env = os.environ if env is None else env
        self.prices = prices if prices is not None else PriceTable.default()
        self.timeouts = timeouts if timeouts is not None else stream_timeouts_from_env(env)
        self._sdk: Any = None if client is None else _without_retries(client, http_timeout)
        if client is not None:
            self._api_key = api_key if api_key is not None else (getattr(client, "api_key", None) or None)
            self._base_url: str | None = str(client.base_url)
            secrets = [self._api_key or "", str(getattr(client, "auth_token", None) or "")]
        else:
            self._api_key = api_key if api_key is not None else (env.get("ANTHROPIC_API_KEY") or None)
            self._base_url = base_url if base_url is not None else (env.get("ANTHROPIC_BASE_URL") or None)
            secrets = [self._api_key or ""]
        password = url_password(self._base_url or "")
        self._redactor = Redactor([s for s in secrets if s], url_passwords=[password] if password else [])
        self._http: MessagesHTTP | None = None
        if client is None and self._api_key:
            self._http = MessagesHTTP(self._api_key, self._base_url, http_timeout, self._redactor)

    def __repr__(self) -> str:
        key = "'***'" if self._api_key else "None"
        where = self._redact(self._base_url) if self._base_url else None
        return f"{type(self).__name__}(base_url={where!r}, api_key={key})"

    @property
    def uses_sdk(self) -> bool:
        """Whether requests go through an ``anthropic`` SDK client passed as ``client=`` (else httpx)."""
        return self._sdk is not None

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        timeouts: StreamTimeouts | None = None,
        on_event: OnEvent | None = None,
        **params: Any,
    ) -> LLMReply:
        """Stream one Messages API call and return the whole reply.

        ``params`` go to ``messages.create`` unchanged (``system``, ``tools``, ``tool_choice``,
        ``thinking``, ``stop_sequences``, ``metadata``, ``extra_headers``, ``extra_body``,
        ``extra_query`` ...). Inside a step the request carries the call's ``{job_id}/{step}/{call}`` in
        the ``x-agentlife-invocation`` header.

        Raises:
            LLMTimeout: connect, inter-chunk or total timeout (the response is closed first).
            TransientError: 429 (``retry_after`` from the header), 529, 5xx, connection errors, a
                stream cut off before ``message_stop``.
            PermanentError: 400, 404, 413, 422 and other request errors.
            LLMConfigurationError: no API key, 401, 403.
        """
        if "stream" in params:
            raise TypeError("AnthropicLLM.complete always streams; do not pass stream=")
        address = CURRENT_CALL.get()
        if address is not None:
            params["extra_headers"] = {INVOCATION_HEADER: str(address), **(params.get("extra_headers") or {})}
        request = {"model": model, "messages": _api_messages(messages), "max_tokens": max_tokens, **params}
        request["stream"] = True
        holder = ResponseHolder()
        return await collect_reply(
            await self._source(holder, request),
            timeouts or self.timeouts,
            close=holder.aclose,
            prices=self.prices,
            model=model,
            on_event=on_event,
        )

    async def aclose(self) -> None:
        """Close agentlife's HTTP client and its connection pool (idempotent); a client passed is yours."""
        if self._http is not None:
            await self._http.aclose()

    async def _source(self, holder: ResponseHolder, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The events of ``request``: from the SDK client passed, else over httpx (built off the clock)."""
        if self._sdk is not None:
            return self._sdk_events(holder, request)
        if self._http is None:
            raise LLMConfigurationError(_NO_KEY)
        await self._http.prepare()
        return self._http.events(holder, request)

    async def _sdk_events(
        self, holder: ResponseHolder, request: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        import anthropic  # loaded already: the caller built its client with it

        try:
            stream = await self._sdk.messages.create(**request)
        except anthropic.AnthropicError as exc:
            raise self._map_sdk_error(exc, anthropic) from exc
        holder.response = stream.response
        response_seen(stream.response.status_code, stream.response.headers)
        content_type = str(stream.response.headers.get("content-type", ""))
        if "text/event-stream" not in content_type.lower():
            where = self._base_url or "the default endpoint"
            raise PermanentError(self._redact(not_a_stream(where, stream.response.status_code, content_type)))
        async for event in checked_events(stream.response, self._redactor):
            yield event

    def _map_sdk_error(self, exc: Exception, module: Any) -> CallError:
        if isinstance(exc, module.APIStatusError):
            response_seen(exc.status_code, exc.response.headers)
            error_type, message = error_details(exc.body)
            return error_for_status(
                exc.status_code,
                error_type=error_type,
                message=self._redact(message) if message else None,
                retry_after=parse_retry_after(exc.response.headers),
            )
        if isinstance(exc, module.APITimeoutError):
            return TransientError("the Anthropic API request timed out (HTTP client timeout)")
        if isinstance(exc, module.APIConnectionError):
            cause = exc.__cause__
            detail = describe_error(cause) if cause is not None else str(exc)
            where = self._base_url or "the default endpoint"
            return TransientError(self._redact(f"cannot reach the Anthropic API at {where}: {detail}"))
        return PermanentError(self._redact(f"Anthropic SDK error: {describe_error(exc)}"))

    def _redact(self, text: str) -> str:
        return self._redactor.redact(text)


def _without_retries(client: Any, http_timeout: float | None) -> Any:
    """``client`` as agentlife uses it: its own retries off (agentlife retries inside the budgets)."""
    # AsyncAnthropic, AsyncAnthropicBedrock and AsyncAnthropicVertex all derive from the SDK's async base;
    # a sync client would hand back a stream that cannot be awaited.
    if not any(cls.__name__ == "AsyncAPIClient" for cls in type(client).__mro__):
        raise TypeError(
            f"AnthropicLLM(client=...) takes an anthropic.AsyncAnthropic, not {type(client).__name__}"
        )
    options: dict[str, Any] = {"max_retries": 0}
    if http_timeout is not None:
        options["timeout"] = http_timeout
    return client.with_options(**options)


def _api_messages(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The messages without the ``partial_json`` agentlife 0.2 kept in a broken ``tool_use`` block.

    A conversation saved by that version would otherwise be refused by the API (not an API field).
    """
    out = list(messages)
    for position, message in enumerate(out):
        content = message.get("content")
        if isinstance(content, (list, tuple)) and any(
            isinstance(block, Mapping) and "partial_json" in block for block in content
        ):
            blocks = [_without_partial_json(block) for block in content]
            out[position] = {**message, "content": blocks}
    return out


def _without_partial_json(block: Any) -> Any:
    if isinstance(block, Mapping) and "partial_json" in block:
        return {key: value for key, value in block.items() if key != "partial_json"}
    return block
