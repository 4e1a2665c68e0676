"""The Anthropic Messages API over plain HTTP: the default transport of `AnthropicLLM`.

``import anthropic`` costs two to three seconds of CPU and ~65 MiB; a streaming ``POST /v1/messages`` needs
none of it. `MessagesHTTP` sends the request with httpx (imported, and its client built, on a worker thread
at the first call: ~0.1 s), or to a plain ``http://`` server on this machine with agentlife's loopback
client (`agentlife._llm._loopback_http`), with the headers the SDK sends (``x-api-key``,
``anthropic-version``), and hands the response to `sse_events`, the Messages API's events read with the
bounded Server-Sent Events decoder both adapters share (`agentlife._llm._sse`).

What the two transports share lives here too, so they cannot drift: the error for an HTTP status or a
mid-stream ``error`` event (`error_for_status`, `error_for_event`), ``retry-after`` parsing, and the
events with their error mapping (`checked_events`).

Redirects are not followed: the ``x-api-key`` header would go to whatever host the redirect names.
"""

from __future__ import annotations

import email.utils
import logging
import math
import time
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from agentlife._exceptions import CallError, PermanentError, TransientError, describe_error
from agentlife._llm._http import LazyClient, ResponseHolder, http_base_url, is_loopback, loopback_client
from agentlife._llm._ratelimit_headers import response_seen
from agentlife._llm._sse import read_error_body, server_sent_events
from agentlife._llm._tls import tls_context
from agentlife._llm._transport import HttpxTransport, Transport, TransportError, TransportTimeout
from agentlife._redact import Redactor
from agentlife._retry import classify, error_for_http_status
from agentlife._version import __version__

__all__ = [
    "API_VERSION",
    "DEFAULT_BASE_URL",
    "RETRY_AFTER_TOO_LARGE",
    "MessagesHTTP",
    "ResponseHolder",
    "checked_events",
    "error_details",
    "error_for_event",
    "error_for_status",
    "not_a_stream",
    "parse_retry_after",
    "raise_for_error_event",
    "sse_events",
]

_log = logging.getLogger("agentlife.llm")

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
# The SDK's defaults, kept: 10 minutes per read with a 5 s connect, and its connection pool.
_READ_TIMEOUT = 600.0
_CONNECT_TIMEOUT = 5.0

#: The HTTP status each error ``type`` of the Messages API stands for, for errors sent mid-stream.
ERROR_TYPE_STATUS: Mapping[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

# --- errors -------------------------------------------------------------------------------------------


def error_for_status(
    status: int,
    *,
    error_type: str | None = None,
    message: str | None = None,
    retry_after: float | None = None,
) -> CallError:
    """The agentlife error for an HTTP error status of the Messages API.

    429, 529, 408/409 and 5xx give `TransientError` (with ``retry_after`` when the server said),
    401/403 `LLMConfigurationError`, any other status `PermanentError`. The returned exception carries
    ``status_code``.
    """
    return error_for_http_status(
        status,
        api="Anthropic API",
        key_variable="ANTHROPIC_API_KEY",
        error_type=error_type,
        message=message,
        retry_after=retry_after,
    )


def error_for_event(error: Mapping[str, Any], redactor: Redactor | None = None) -> CallError:
    """The agentlife error for an ``error`` event sent in the middle of a stream.

    ``redactor`` masks what the server put in the message (a server may echo the key it was sent).
    """
    error_type = str(error.get("type") or "api_error")
    status = ERROR_TYPE_STATUS.get(error_type, 500)
    message = str(error.get("message") or "") or None
    if message is not None and redactor is not None:
        message = redactor.redact(message)
    return error_for_status(status, error_type=error_type, message=message)


def raise_for_error_event(event: Mapping[str, Any], redactor: Redactor) -> None:
    """Raise the error an ``error`` event stands for, its message masked; other events pass."""
    if event.get("type") == "error":
        error = event.get("error")
        raise error_for_event(error if isinstance(error, Mapping) else {}, redactor)


def error_details(body: Any) -> tuple[str | None, str | None]:
    """The ``error.type`` and ``error.message`` of an API error body, when it is one."""
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping):
            error_type, message = error.get("type"), error.get("message")
            return (str(error_type) if error_type else None, str(message) if message else None)
    return None, None


#: What a ``retry-after`` too large for a float (``1e400``, a thousand digits) reads as: longer than any
#: wait anything believes, so each consumer cuts it to its own bound (and says so), finite for arithmetic.
RETRY_AFTER_TOO_LARGE = 1e9


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date), if any.

    A number too large for a float is `RETRY_AFTER_TOO_LARGE`, not "none": it asked for a long wait.
    """
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return _non_negative(float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return _non_negative(float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _non_negative(value: float) -> float | None:
    if value == math.inf:  # a positive number past a float's range: "1e400" is a long wait, not none
        return RETRY_AFTER_TOO_LARGE
    return value if math.isfinite(value) and value >= 0 else None


def not_a_stream(where: str, status: int, content_type: str) -> str:
    """Why a ``200`` whose body is not a stream of events (a proxy's login page, a JSON body) fails."""
    return (
        f"the Anthropic API at {where} answered {status} with {content_type or 'no content type'}, not a "
        "stream of SSE (Server-Sent Events): is ANTHROPIC_BASE_URL the API's root (a proxy's login or "
        "error page?)"
    )


# --- Server-Sent Events -------------------------------------------------------------------------------


async def sse_events(response: Any) -> AsyncIterator[dict[str, Any]]:
    """Decode the Server-Sent Events of a streaming response into event dicts, pings included.

    ``response`` is an httpx response or the loopback client's (both transports have one). An SSE comment
    line (``: keep-alive``) is yielded as ``{"type": "ping"}`` too: it is progress on the wire, and the
    guard should count it like the API's own ``ping`` events. Data that is not a JSON object is skipped.

    Raises:
        PermanentError: one event is larger than `agentlife._llm._sse.MAX_EVENT_BYTES`.
    """
    async for event in server_sent_events(response, "Anthropic"):
        if event.data is None:
            yield {"type": "ping"}
            continue
        decoded = _decode_event(event.name, event.data)
        if decoded is not None:
            yield decoded


async def checked_events(response: Any, redactor: Redactor) -> AsyncIterator[dict[str, Any]]:
    """The events of a Messages stream over either transport (httpx's response or the SDK's).

    `sse_events`, with an ``error`` event raised as its error (`raise_for_error_event`) and a stream that
    broke raised as a `TransientError`.
    """
    try:
        async for event in sse_events(response):
            raise_for_error_event(event, redactor)
            yield event
    except Exception as exc:
        if isinstance(exc, CallError) or not classify(exc).retryable:
            raise
        raise TransientError(redactor.redact(f"the Anthropic stream broke: {describe_error(exc)}")) from exc


def _decode_event(name: str | None, data: str) -> dict[str, Any] | None:
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        _log.debug("ignoring an SSE event whose data is not JSON (event %r)", name)
        return None
    if not isinstance(event, dict):
        return None
    if "type" not in event and name:
        event["type"] = name
    return event


# --- the transport ------------------------------------------------------------------------------------


class MessagesHTTP:
    """Streams ``POST {base_url}/v1/messages`` with httpx and yields its events.

    Args:
        api_key: sent as ``x-api-key``.
        base_url: the API root (None: ``https://api.anthropic.com``); ``/v1/messages`` is appended.
        http_timeout: httpx's timeout for every phase, a backstop behind the stream guard (None: the SDK's
            default, 600 s with a 5 s connect).
        redactor: masks the key (and a password in the base URL) in every message built here.
    """

    def __init__(
        self, api_key: str, base_url: str | None, http_timeout: float | None, redactor: Redactor
    ) -> None:
        self._api_key = api_key
        self._configured = base_url
        self._base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self._http_timeout = http_timeout
        self._redactor = redactor
        self._client_holder = LazyClient(self._make_client)

    @property
    def where(self) -> str:
        """The base URL as messages name it (``the default endpoint`` when none was configured)."""
        return self._configured or "the default endpoint"

    async def events(self, holder: ResponseHolder, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Send ``request`` (the ``messages.create`` parameters, ``stream`` included) and yield its events.

        ``extra_headers``, ``extra_query``, ``extra_body`` and ``timeout`` are taken as the SDK takes them.
        The response lands in ``holder`` as soon as its headers arrived, so a guard can close it.

        Raises:
            TransientError: connection errors, the HTTP client's timeout, a stream that broke, 429, 529, 5xx.
            PermanentError: another status, a redirect, a ``200`` that is not a stream of events.
            LLMConfigurationError: 401, 403, a base URL that is not ``http(s)://host``.
        """
        transport = await self._client_holder.get()
        body = dict(request)
        headers = {str(k): str(v) for k, v in (body.pop("extra_headers", None) or {}).items()}
        query = body.pop("extra_query", None)
        timeout = body.pop("timeout", None)
        body.update(body.pop("extra_body", None) or {})
        url = f"{self._base_url}/v1/messages"
        try:
            response = await transport.stream(
                "POST", url, content=orjson.dumps(body), headers=headers, params=query, timeout=timeout
            )
        except TransportTimeout as exc:
            raise TransientError("the Anthropic API request timed out (HTTP client timeout)") from exc
        except TransportError as exc:
            raise TransientError(
                self._redact(f"cannot reach the Anthropic API at {self.where}: {describe_error(exc)}")
            ) from exc
        holder.response = response
        response_seen(response.status_code, response.headers)
        if not 200 <= response.status_code < 300:
            raise await self._status_error(response)
        content_type = str(response.headers.get("content-type", ""))
        if "text/event-stream" not in content_type.lower():
            raise PermanentError(self._redact(not_a_stream(self.where, response.status_code, content_type)))
        async for event in checked_events(response, self._redactor):
            yield event

    async def _status_error(self, response: Any) -> CallError:
        """The error for a status other than 2xx, from the API's JSON error body when there is one."""
        retry_after = parse_retry_after(response.headers)
        raw = await read_error_body(response)
        try:
            parsed = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            parsed = None
        error_type, message = error_details(parsed)
        if 300 <= response.status_code < 400 and message is None:
            target = _origin(str(response.headers.get("location", "")))
            message = f"redirected to {target or 'nowhere'}; not followed, so the API key stays here"
        return error_for_status(
            response.status_code,
            error_type=error_type,
            message=self._redact(message) if message else None,
            retry_after=retry_after,
        )

    async def aclose(self) -> None:
        """Close the HTTP client and its connection pool (idempotent)."""
        await self._client_holder.aclose()

    async def prepare(self) -> None:
        """Import httpx and build the client, once; the adapter awaits it before the connect clock runs.

        Raises:
            LLMConfigurationError: the base URL is not ``http(s)://host``.
        """
        await self._client_holder.get()

    def _make_client(self) -> Transport:
        parts = http_base_url(self._base_url, "ANTHROPIC_BASE_URL", self._redact)
        headers = {
            "x-api-key": self._api_key,
            "anthropic-version": API_VERSION,
            "content-type": "application/json",
            "accept": "application/json",
            "user-agent": f"agentlife/{__version__}",
        }
        connect, read = (
            (_CONNECT_TIMEOUT, _READ_TIMEOUT) if self._http_timeout is None else (self._http_timeout,) * 2
        )
        local = loopback_client(parts, headers, connect_timeout=connect, read_timeout=read)
        if local is not None:
            return local
        import httpx

        if self._http_timeout is None:
            timeout = httpx.Timeout(_READ_TIMEOUT, connect=_CONNECT_TIMEOUT)
        else:
            timeout = httpx.Timeout(self._http_timeout)
        # A proxy from the environment must not catch requests to a server on this machine.
        trust_env = not is_loopback(parts.hostname or "")
        client = httpx.AsyncClient(
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100),
            follow_redirects=False,
            trust_env=trust_env,
            verify=tls_context(parts.scheme, trust_env=trust_env),
        )
        return HttpxTransport(httpx, client)

    def _redact(self, text: str) -> str:
        return self._redactor.redact(text)


def _origin(url: str) -> str:
    """``scheme://host[:port]`` of a redirect target: never its path, query or userinfo."""
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme or not parts.hostname:
        return ""
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{parts.hostname}{port}"
