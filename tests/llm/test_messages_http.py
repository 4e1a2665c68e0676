"""`AnthropicLLM`'s default transport (httpx) against servers that lie.

Some servers here are `FakeAnthropicServer` with an odd script; the ones whose misbehaviour is below
HTTP (a line cut across TCP writes, a line that never ends, a redirect to another port) are a few lines of
``asyncio.start_server`` that write exactly the bytes each test chooses.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import pytest

from agentlife import (
    LLMConfigurationError,
    LLMReply,
    PermanentError,
    StreamEvent,
    StreamTimeouts,
    TransientError,
    Usage,
)
from agentlife._llm._anthropic import AnthropicLLM
from agentlife._llm._scripted import ScriptedEvent, ScriptedTurn
from agentlife._llm._sse import MAX_EVENT_BYTES
from agentlife._retry import retry_call
from agentlife.testing._anthropic_server import FakeAnthropicServer, _sse

pytestmark = pytest.mark.anyio

KEY = "sk-ant-api03-hostile-secret-0123456789"
FAST = StreamTimeouts(connect=2.0, chunk=2.0, total=20.0)
MESSAGES = [{"role": "user", "content": "Hello?"}]
MODEL = "claude-sonnet-agentlife-test"
Respond = Callable[[asyncio.StreamWriter], Awaitable[None]]
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"


@asynccontextmanager
async def raw_server(respond: Respond) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A server on 127.0.0.1 that reads one request per connection and lets ``respond`` write the bytes."""
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            body = await reader.readexactly(int(length.group(1))) if length else b""
            requests.append(head + body)
            await respond(writer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}", requests


def stream_bytes(turn: ScriptedTurn) -> bytes:
    return b"".join(_sse(scripted.event) for scripted in turn.stream_events(model=MODEL, messages=[]))


async def ask(url: str, **params: object) -> LLMReply:
    llm = AnthropicLLM(api_key=KEY, base_url=url, timeouts=FAST)
    try:
        return await llm.complete(model=MODEL, messages=MESSAGES, max_tokens=64, **params)
    finally:
        await llm.aclose()


async def test_the_request_carries_the_key_the_api_version_and_the_base_urls_path() -> None:
    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + stream_bytes(ScriptedTurn.text("hi")))

    async with raw_server(respond) as (url, requests):
        reply = await ask(f"{url}/proxy/", extra_headers={"x-team": "a"}, extra_query={"beta": "1"})
    assert reply.text == "hi"
    [request] = requests
    head = request.split(b"\r\n\r\n")[0].decode().lower()
    assert head.startswith("post /proxy/v1/messages?beta=1 http/1.1")
    assert f"x-api-key: {KEY}".lower() in head
    assert "anthropic-version: 2023-06-01" in head and "x-team: a" in head
    assert b'"stream":true' in request


async def test_a_stream_written_seven_bytes_at_a_time_with_crlf_is_read_whole() -> None:
    usage = Usage(input_tokens=12, output_tokens=5)
    data = stream_bytes(ScriptedTurn.text("Split across many writes.", chunks=4, usage=usage))
    data = data.replace(b"\n", b"\r\n")  # and a CRLF cut between two writes, more than once

    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD)
        for start in range(0, len(data), 7):
            writer.write(data[start : start + 7])
            await writer.drain()
            await asyncio.sleep(0.0005)

    async with raw_server(respond) as (url, _):
        reply = await ask(url)
    assert reply.text == "Split across many writes." and reply.usage == usage


async def test_a_line_that_never_ends_is_refused_once_past_the_event_limit() -> None:
    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + b"data: " + b"x" * (1024 * 1024))
        for _ in range(MAX_EVENT_BYTES // (1024 * 1024) + 2):
            writer.write(b"y" * (1024 * 1024))
            await writer.drain()

    async with raw_server(respond) as (url, requests):
        with pytest.raises(PermanentError, match="an event over 32 MiB without an end"):
            await retry_call(lambda: ask(url), initial=0.01, deadline=anyio.current_time() + 30)
    assert len(requests) == 1  # not retried


async def test_a_huge_single_event_within_the_limit_is_read_whole() -> None:
    big = "0123456789abcdef" * (256 * 1024)  # 4 MiB of text in one delta
    events = list(ScriptedTurn.text("x").events)
    stop = next(i for i, e in enumerate(events) if e.event.get("type") == "content_block_stop")
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": big}}
    events.insert(stop, ScriptedEvent(delta))
    async with FakeAnthropicServer([ScriptedTurn(events=tuple(events))]) as server:
        reply = await ask(server.base_url)
    assert reply.text == "x" + big


async def test_an_event_type_never_seen_is_passed_on_and_does_not_break_the_reply() -> None:
    events = list(ScriptedTurn.text("still fine").events)
    events.insert(2, ScriptedEvent({"type": "mystery_event", "index": 0, "payload": [1, 2]}))
    seen: list[StreamEvent] = []
    async with FakeAnthropicServer([ScriptedTurn(events=tuple(events))]) as server:
        reply = await ask(server.base_url, on_event=seen.append)
    assert reply.text == "still fine"
    assert [e.raw["type"] for e in seen if e.kind == "other"].count("mystery_event") == 1


async def test_a_stream_without_message_stop_is_a_transient_error_not_a_reply() -> None:
    events = [e for e in ScriptedTurn.text("almost").events if e.event.get("type") != "message_stop"]
    async with FakeAnthropicServer([ScriptedTurn(events=tuple(events))]) as server:
        with pytest.raises(TransientError, match="ended before message_stop"):
            await ask(server.base_url)


async def test_a_stream_without_usage_counts_zero_tokens() -> None:
    def without_usage(event: dict[str, object]) -> dict[str, object]:
        event = {k: v for k, v in event.items() if k != "usage"}
        message = event.get("message")
        if isinstance(message, dict):
            event["message"] = {k: v for k, v in message.items() if k != "usage"}
        return event

    events = tuple(ScriptedEvent(without_usage(dict(e.event))) for e in ScriptedTurn.text("free").events)
    async with FakeAnthropicServer([ScriptedTurn(events=events)]) as server:
        reply = await ask(server.base_url)
    assert reply.text == "free" and reply.usage == Usage() and reply.cost_usd == 0.0


async def test_garbage_bytes_then_a_cut_are_a_transient_error() -> None:
    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + b"\xff\xfe\x00garbage\n\ndata: {not json\n\n")

    async with raw_server(respond) as (url, _):
        with pytest.raises(TransientError, match="ended before message_stop"):
            await ask(url)


@pytest.mark.parametrize("where", ["http_body", "error_event"])
async def test_the_key_echoed_by_the_server_never_reaches_the_error(where: str) -> None:
    echoed = f'invalid x-api-key {KEY} (as JSON: {{"key": "{KEY}"}})'
    if where == "http_body":
        turn = ScriptedTurn.http_error(400, message=echoed)
    else:
        start = ScriptedTurn.text("x").events[0]
        error = {"type": "error", "error": {"type": "invalid_request_error", "message": echoed}}
        turn = ScriptedTurn(events=(start, ScriptedEvent(error)))
    async with FakeAnthropicServer([turn]) as server:
        with pytest.raises(PermanentError) as caught:
            await ask(server.base_url)
    text = f"{caught.value} {caught.value!r}"
    assert "invalid x-api-key ***" in text
    assert KEY not in text and "0123456789" not in text


async def test_a_redirect_to_another_host_is_not_followed_so_the_key_stays_here() -> None:
    async def elsewhere(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + stream_bytes(ScriptedTurn.text("stolen")))

    async with raw_server(elsewhere) as (other, stolen):

        async def redirect(writer: asyncio.StreamWriter) -> None:
            location = f"{other}/v1/messages?token=abc".encode()
            writer.write(b"HTTP/1.1 307 Temporary Redirect\r\nlocation: " + location + b"\r\n")
            writer.write(b"content-length: 0\r\nconnection: close\r\n\r\n")

        async with raw_server(redirect) as (url, requests):
            with pytest.raises(PermanentError, match="307") as caught:
                await retry_call(lambda: ask(url), initial=0.01, deadline=anyio.current_time() + 5)
    assert stolen == [] and len(requests) == 1
    assert f"redirected to {other}; not followed" in str(caught.value)
    assert "token=abc" not in str(caught.value)


@pytest.mark.parametrize(
    "url", ["localhost:8080", "ftp://example.com", "http://", "http://[::1", "http://h:99999"]
)
async def test_a_base_url_that_is_not_http_is_a_configuration_error_before_any_request(url: str) -> None:
    with pytest.raises(LLMConfigurationError, match="is not an http:// or https:// URL"):
        await ask(url)


async def test_a_password_in_the_base_url_never_reaches_an_error_or_the_repr() -> None:
    async with FakeAnthropicServer() as gone:
        port = gone.base_url.rsplit(":", 1)[1]
    url = f"http://proxy-user:p%40ss word-0123@127.0.0.1:{port}"
    llm = AnthropicLLM(api_key=KEY, base_url=url, timeouts=FAST)
    try:
        with pytest.raises(TransientError, match="cannot reach the Anthropic API") as caught:
            await llm.complete(model=MODEL, messages=MESSAGES, max_tokens=8)
    finally:
        await llm.aclose()
    assert "p%40ss word-0123" not in str(caught.value) and "p%40ss word-0123" not in repr(llm)


async def test_a_client_that_is_not_an_async_sdk_client_is_refused() -> None:
    import anthropic

    with pytest.raises(TypeError, match=r"takes an anthropic\.AsyncAnthropic, not Anthropic"):
        AnthropicLLM(client=anthropic.Anthropic(api_key=KEY))
