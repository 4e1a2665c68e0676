"""The OpenAI-compatible adapter: `OpenAICompatibleLLM`, streaming through the progress guard.

One adapter for every server of the Chat Completions streaming API: OpenAI itself, vLLM, Ollama, LiteLLM
and the other proxies. It speaks plain HTTP with httpx, or with the loopback client to a plain ``http://``
server on this machine (``POST {base_url}/chat/completions`` with ``stream: true`` and
``stream_options.include_usage``), decodes the Server-Sent Events with the bounded decoder the Anthropic
adapter uses too (`agentlife._llm._sse`) and passes each chunk (SSE comments too: they are progress on the
wire) through `guard_stream`, which closes the response on a timeout or a cancellation so the server sees
the disconnect at once.

Requests and replies are translated to and from agentlife's Anthropic-shaped content blocks by
`agentlife._llm._openai_format`, so tools, ``ctx.run_tool_calls``, the journal and replay work unchanged.

httpx is imported, and its client built (see `agentlife._llm._tls`), on a worker thread at the first call.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
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
from agentlife._llm._anthropic import parse_retry_after
from agentlife._llm._guard import guard_stream, stream_timeouts_from_env
from agentlife._llm._http import LazyClient, ResponseHolder, http_base_url, is_loopback, loopback_client
from agentlife._llm._openai_format import (
    ChatAssembler,
    chat_request,
    chat_stream_event,
    error_details,
    error_for_status,
)
from agentlife._llm._pricing import PriceTable
from agentlife._llm._protocol import CURRENT_CALL, INVOCATION_HEADER, LLMReply, OnEvent, StreamTimeouts
from agentlife._llm._ratelimit_headers import response_seen
from agentlife._llm._sse import read_error_body, server_sent_events
from agentlife._llm._tls import tls_context
from agentlife._llm._transport import HttpxTransport, Transport, TransportError, TransportTimeout
from agentlife._redact import Redactor
from agentlife._retry import classify

__all__ = ["DEFAULT_OPENAI_BASE_URL", "OpenAICompatibleLLM", "key_required", "sse_chunks"]

_log = logging.getLogger("agentlife.llm")

DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
#: What `sse_chunks` yields for an SSE comment line (a keep-alive): progress, but not a chunk.
KEEPALIVE: Mapping[str, Any] = {"object": "agentlife.keepalive"}
_NO_KEY = (
    "OPENAI_API_KEY is not set: export it (and OPENAI_BASE_URL for another server), pass api_key= to "
    "OpenAICompatibleLLM, or return a ScriptedLLM from make_llm() to run without a model"
)
# The most of an error body that is not JSON kept for the message: the server's explanation, never a page.
_MAX_ERROR_TEXT = 2000


def key_required(base_url: str) -> bool:
    """Whether a server needs an API key: OpenAI's own API does; local and self-hosted servers may not.

    vLLM, Ollama and a LiteLLM proxy run without a key unless configured with one, so a missing
    ``OPENAI_API_KEY`` is only an error up front for ``*.openai.com``; elsewhere the request goes without
    an ``Authorization`` header and a server that wants one answers 401 (`LLMConfigurationError`).
    """
    try:
        host = (urllib.parse.urlsplit(base_url).hostname or "").lower()
    except ValueError:  # "http://[::1": the first call says what is wrong with it
        return False
    return host == "openai.com" or host.endswith(".openai.com")


class OpenAICompatibleLLM:
    """`LLMClient` for the OpenAI Chat Completions streaming API (OpenAI, vLLM, Ollama, LiteLLM ...).

    Args:
        base_url: the API root, up to and including ``/v1`` (``http://localhost:8000/v1`` for vLLM,
            ``http://localhost:11434/v1`` for Ollama, ``http://localhost:4000`` for LiteLLM); None reads
            ``OPENAI_BASE_URL``, default ``https://api.openai.com/v1``.
        api_key: the API key, sent as ``Authorization: Bearer``; None reads ``OPENAI_API_KEY``. Without
            one, the first `complete` against ``*.openai.com`` raises `LLMConfigurationError`; other servers
            are called without the header (see `key_required`).
        prices: the price table for ``LLMReply.cost_usd`` (default `PriceTable.default`, which lists the
            common OpenAI models; a self-hosted model is unknown to it and costs 0, logged once).
        timeouts: the stream timeouts used when `complete` gets none; None reads
            ``AGENTLIFE_LLM_*_TIMEOUT_SECONDS`` (their defaults are `CallConstants`').
        http_timeout: the HTTP client's own timeout in seconds, a backstop behind the stream guard
            (default 600).
        env: where to read the variables above (default `os.environ`).

    Example:
        >>> llm = OpenAICompatibleLLM("http://127.0.0.1:8000/v1", api_key="sk-test-0123456789")
        >>> llm
        OpenAICompatibleLLM(base_url='http://127.0.0.1:8000/v1', api_key='***')
    """

    streams_events = True
    #: ``gen_ai.provider.name`` of its calls, and its row in `agentlife._providers.PROVIDERS`.
    provider = "openai"

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        prices: PriceTable | None = None,
        timeouts: StreamTimeouts | None = None,
        http_timeout: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self._api_key = api_key if api_key is not None else (env.get("OPENAI_API_KEY") or None)
        url = base_url if base_url is not None else (env.get("OPENAI_BASE_URL") or DEFAULT_OPENAI_BASE_URL)
        self._base_url = url.rstrip("/")
        self.prices = prices if prices is not None else PriceTable.default()
        self.timeouts = timeouts if timeouts is not None else stream_timeouts_from_env(env)
        self._http_timeout = 600.0 if http_timeout is None else http_timeout
        self._redactor = Redactor([self._api_key] if self._api_key else [])
        self._client_holder = LazyClient(self._make_client)

    def __repr__(self) -> str:
        key = "'***'" if self._api_key else "None"
        return f"{type(self).__name__}(base_url={self._base_url!r}, api_key={key})"

    @property
    def base_url(self) -> str:
        """The API root requests go to (``{base_url}/chat/completions``)."""
        return self._base_url

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
        """Stream one Chat Completions call and return the whole reply, in Anthropic-shaped blocks.

        ``params`` are Anthropic-style (``system``, ``tools``, ``tool_choice``, ``stop_sequences``,
        ``temperature`` ...) and translated by `chat_request`; ``extra_headers`` and ``extra_body`` are
        merged into the request as they are. Inside a step the request carries the call's
        ``{job_id}/{step}/{call}`` in the ``x-agentlife-invocation`` header.

        Raises:
            LLMTimeout: connect, inter-chunk or total timeout (the response is closed first).
            TransientError: 429 (``retry_after`` from ``retry-after-ms`` / ``retry-after``), 408, 409,
                5xx, connection errors, a stream cut off before its ``finish_reason``.
            PermanentError: 400, 404, 422 and other request errors; a block the format cannot express.
            LLMConfigurationError: no API key for OpenAI's own API, 401, 403.
        """
        if "stream" in params:
            raise TypeError("OpenAICompatibleLLM.complete always streams; do not pass stream=")
        headers = {str(k): str(v) for k, v in (params.pop("extra_headers", None) or {}).items()}
        extra_body = params.pop("extra_body", None) or {}
        body = {**chat_request(model, messages, max_tokens, params), **extra_body}
        transport = await self._client()
        address = CURRENT_CALL.get()
        if address is not None:
            headers.setdefault(INVOCATION_HEADER, str(address))
        holder = ResponseHolder()
        assembler = ChatAssembler(model)
        source = self._chunks(transport, holder, body, headers)
        async with aclosing(guard_stream(source, timeouts or self.timeouts, close=holder.aclose)) as stream:
            async for chunk in stream:
                if chunk is KEEPALIVE:
                    continue
                if chunk is _DONE:
                    break
                assembler.feed(chunk)
                if on_event is not None:
                    on_event(chat_stream_event(chunk))
        return assembler.reply(self.prices)

    async def aclose(self) -> None:
        """Close the HTTP client and its connection pool (idempotent)."""
        await self._client_holder.aclose()

    async def _client(self) -> Transport:
        if not self._api_key and key_required(self._base_url):
            raise LLMConfigurationError(_NO_KEY)
        return await self._client_holder.get()

    def _make_client(self) -> Transport:
        headers = {"accept": "text/event-stream"}
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        parts = http_base_url(self._base_url, "OPENAI_BASE_URL", self._redactor.redact)
        timeout = self._http_timeout
        local = loopback_client(parts, headers, connect_timeout=timeout, read_timeout=timeout)
        if local is not None:
            return local
        import httpx

        # A proxy from the environment must not catch requests to a server on this machine.
        trust_env = not is_loopback(parts.hostname or "")
        client = httpx.AsyncClient(
            headers=headers,
            timeout=self._http_timeout,
            trust_env=trust_env,
            verify=tls_context(parts.scheme, trust_env=trust_env),
        )
        return HttpxTransport(httpx, client)

    async def _chunks(
        self,
        transport: Transport,
        holder: ResponseHolder,
        body: dict[str, Any],
        headers: dict[str, str],
    ) -> AsyncIterator[Mapping[str, Any]]:
        url = f"{self._base_url}/chat/completions"
        try:
            response = await transport.stream(
                "POST",
                url,
                content=orjson.dumps(body),
                headers={"content-type": "application/json", **headers},
            )
        except TransportTimeout as exc:
            raise TransientError("the OpenAI-compatible API request timed out (HTTP client timeout)") from exc
        except TransportError as exc:
            raise TransientError(
                self._redact(
                    f"cannot reach the OpenAI-compatible API at {self._base_url}: {describe_error(exc)}"
                )
            ) from exc
        holder.response = response
        response_seen(response.status_code, response.headers)
        if response.status_code != 200:
            raise await self._status_error(response)
        content_type = str(response.headers.get("content-type", ""))
        if "text/event-stream" not in content_type:
            # A server that ignores ``stream: true``, or a web page at a wrong base URL: retrying cannot help.
            raise PermanentError(
                self._redact(
                    f"the server at {self._base_url} answered with {content_type or 'no content type'}, "
                    "not a stream of SSE (Server-Sent Events): is the base URL an OpenAI-compatible API "
                    "(.../v1)?"
                )
            )
        try:
            async with aclosing(sse_chunks(response)) as chunks:
                async for chunk in chunks:
                    yield chunk
        except Exception as exc:
            if isinstance(exc, CallError) or not classify(exc).retryable:
                raise
            raise TransientError(
                self._redact(f"the OpenAI-compatible stream broke: {describe_error(exc)}")
            ) from exc

    async def _status_error(self, response: Any) -> CallError:
        retry_after = parse_retry_after(response.headers)
        raw = await read_error_body(response)
        try:
            parsed = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            parsed = None
        error_type, message = error_details(parsed)
        if message is not None:
            message = self._redact(message)
        elif raw:
            # Masked whole, then cut: a key cut in two is a piece no redactor recognises.
            message = self._redact(raw.decode(errors="replace"))[:_MAX_ERROR_TEXT].strip() or None
        return error_for_status(
            response.status_code, error_type=error_type, message=message or None, retry_after=retry_after
        )

    def _redact(self, text: str) -> str:
        return self._redactor.redact(text)


#: What `sse_chunks` yields for ``data: [DONE]``: the stream is over.
_DONE: Mapping[str, Any] = {"object": "agentlife.done"}


async def sse_chunks(response: Any) -> AsyncGenerator[Mapping[str, Any], None]:
    """Decode the ``data:`` events of a streaming Chat Completions response into chunk dicts.

    An SSE comment (``: keep-alive``) is yielded as `KEEPALIVE` (progress for the guard), ``[DONE]`` as a
    marker that ends the stream; data that is not a JSON object is skipped.

    Raises:
        PermanentError: one event is larger than `agentlife._llm._sse.MAX_EVENT_BYTES`.
    """
    async with aclosing(server_sent_events(response, "OpenAI-compatible")) as events:
        async for event in events:
            if event.data is None:
                yield KEEPALIVE
                continue
            chunk = _decode(event.data)
            if chunk is not None:
                yield chunk
                if chunk is _DONE:
                    return


def _decode(text: str) -> Mapping[str, Any] | None:
    if text.strip() == "[DONE]":
        return _DONE
    try:
        chunk = orjson.loads(text)
    except orjson.JSONDecodeError:
        _log.debug("ignoring an SSE event whose data is not JSON")
        return None
    return chunk if isinstance(chunk, dict) else None
