"""The Server-Sent Events decoder and the error-body reader both model adapters share, against servers
that lie, over both transports (agentlife's loopback client for 127.0.0.1, httpx for this machine's other
address), plus properties of the decoder on any bytes cut anywhere.

The servers are a few lines of ``asyncio.start_server`` that write exactly the bytes each test chooses.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _net import PROXY_VARIABLES, non_loopback_address
from agentlife import (
    AnthropicLLM,
    LLMConfigurationError,
    LLMReply,
    LLMTimeout,
    OpenAICompatibleLLM,
    PermanentError,
    StreamTimeouts,
    TransientError,
)
from agentlife._llm import _sse
from agentlife._llm._scripted import ScriptedTurn
from agentlife._llm._sse import COMMENT, MAX_ERROR_BODY_BYTES, ServerSentEvent, server_sent_events
from agentlife.testing._anthropic_server import _sse as anthropic_event
from agentlife.testing._openai_server import chat_chunks

pytestmark = pytest.mark.anyio

KEY = "sk-test-sse-secret-0123456789abcdef"
MODEL = "test-model"
# The connect clock runs until the first event, so it also bounds the reading of an error body: shorter
# than `ERROR_BODY_SECONDS`, so that only the byte limit can end a body that never ends in time.
TIMEOUTS = StreamTimeouts(connect=3.0, chunk=3.0, total=20.0)
Respond = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(params=["loopback", "httpx"])
def host(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "loopback":
        return "127.0.0.1"
    for variable in PROXY_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    return non_loopback_address()


@pytest.fixture(params=["anthropic", "openai"])
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def raw_server(host: str, respond: Respond) -> AsyncIterator[str]:
    """A server on ``host`` that reads one request per connection and lets ``respond`` write the bytes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
            await respond(reader, writer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://{host}:{port}"


async def ask(api: str, url: str) -> LLMReply:
    messages = [{"role": "user", "content": "Hello?"}]
    llm: Any
    if api == "anthropic":
        llm = AnthropicLLM(api_key=KEY, base_url=url, timeouts=TIMEOUTS)
    else:
        llm = OpenAICompatibleLLM(f"{url}/v1", api_key=KEY, timeouts=TIMEOUTS)
    try:
        reply: LLMReply = await llm.complete(model=MODEL, messages=messages, max_tokens=64)
        return reply
    finally:
        await llm.aclose()


def stream_of(api: str, turn: ScriptedTurn) -> bytes:
    """What the API's server sends for ``turn``, as the fake servers encode it."""
    events = turn.stream_events(model=MODEL, messages=[])
    if api == "anthropic":
        return b"".join(anthropic_event(scripted.event) for scripted in events)
    return b"".join(chunk for _, chunk in chat_chunks(events, model=MODEL))


SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"


# --- error bodies -----------------------------------------------------------------------------------------


async def test_an_error_body_that_never_ends_is_read_up_to_64_kib_and_the_status_decides(
    api: str, host: str
) -> None:
    # A 500 whose body goes on for ever (a proxy streaming a page, a server looping): the adapter reads the
    # first 64 KiB, stops, and raises the status's error; it never waits for the end, which never comes.
    hung_up = asyncio.Event()

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/html\r\n")
            writer.write(b"connection: close\r\n\r\n<html>" + b"x" * (4 * MAX_ERROR_BODY_BYTES))
            await writer.drain()
            await reader.read()  # until the client hangs up (an EOF or a reset)
        finally:
            hung_up.set()

    async with raw_server(host, respond) as url:
        with pytest.raises(TransientError) as caught:
            await ask(api, url)
        await asyncio.wait_for(hung_up.wait(), 10)  # the client closed the connection, not left it open
    assert not isinstance(caught.value, LLMTimeout), caught.value
    assert caught.value.status_code == 500
    assert len(str(caught.value)) < 2500  # a short message, never the page


async def test_an_error_body_that_trickles_gives_way_to_its_status_not_a_timeout(
    api: str, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 401 whose body comes a byte at a time and stalls: the key is wrong, whatever the body does. Read for
    # longer than the connect clock, it would become a connect timeout, a transient error retried for
    # nothing; read for at most ERROR_BODY_SECONDS (here 0.2 s), it is the configuration error it is.
    monkeypatch.setattr(_sse, "ERROR_BODY_SECONDS", 0.2)

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n")
        writer.write(b"content-length: 1000\r\nconnection: close\r\n\r\n{")
        await writer.drain()
        await reader.read()

    async with raw_server(host, respond) as url:
        with pytest.raises(LLMConfigurationError, match="401"):
            await ask(api, url)


async def test_a_key_echoed_where_the_error_text_is_cut_never_shows_in_part(api: str, host: str) -> None:
    # A proxy's plain-text 400 that echoes the key across the point where the message is cut: masked first,
    # then cut, so no piece of it that a redactor could no longer recognise reaches the error.
    body = ("x" * 1990 + f" {KEY} " + "y" * 5000).encode()

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\nconnection: close\r\n")
        writer.write(b"content-length: %d\r\n\r\n" % len(body) + body)

    async with raw_server(host, respond) as url:
        with pytest.raises(PermanentError) as caught:
            await ask(api, url)
    text = f"{caught.value} {caught.value!r}"
    assert "400" in text
    assert not any(KEY[i : i + 6] in text for i in range(len(KEY) - 5)), text[-200:]


# --- events -------------------------------------------------------------------------------------------------


# 34 MiB each: one decoder behind both adapters, so one pairing of each adapter and transport is enough.
@pytest.mark.parametrize(("api", "host"), [("openai", "httpx"), ("anthropic", "loopback")], indirect=True)
async def test_an_event_of_many_data_lines_without_an_end_is_refused_past_the_limit(
    api: str, host: str
) -> None:
    # Each line short, the blank line that ends the event never sent: the data would grow without end.
    line = b"data: " + b"y" * (1024 * 1024 - 7) + b"\n"

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD)
        for _ in range(_sse.MAX_EVENT_BYTES // len(line) + 2):
            writer.write(line)
            await writer.drain()

    async with raw_server(host, respond) as url:
        with pytest.raises(PermanentError, match="an event over 32 MiB without an end"):
            await ask(api, url)


async def test_a_stream_cut_into_pieces_anywhere_reads_as_it_was_sent(api: str, host: str) -> None:
    # U+2028 and U+0085 raw inside the JSON, CRLF line ends, and writes of 5 bytes: an event, a line, a
    # CRLF and a multi-byte character are each cut between two writes.
    text = "cut\u2028here\x85and é there\u2029"
    data = stream_of(api, ScriptedTurn.text(text, chunks=3)).replace(b"\n", b"\r\n")

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD)
        for start in range(0, len(data), 5):
            writer.write(data[start : start + 5])
            await writer.drain()

    async with raw_server(host, respond) as url:
        reply = await ask(api, url)
    assert reply.text == text


# --- the decoder on its own ---------------------------------------------------------------------------------


class Pieces:
    """A response whose body is ``pieces``, for the decoder alone (the servers above test the transports)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self._pieces = pieces

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        for piece in self._pieces:
            yield piece


async def decoded(pieces: list[bytes]) -> list[ServerSentEvent]:
    return [event async for event in server_sent_events(Pieces(pieces), "test")]


def cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


# Event data: any text without CR or LF (those end lines), names likewise.
line_text = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=20)
events_strategy = st.lists(
    st.tuples(st.one_of(st.none(), line_text), st.lists(line_text, min_size=1, max_size=3)),
    max_size=5,
)


@settings(max_examples=100, deadline=None)
@given(
    events=events_strategy,
    ending=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_any_events_cut_anywhere_decode_to_what_was_sent(
    events: list[tuple[str | None, list[str]]], ending: bytes, cuts: list[int]
) -> None:
    import anyio

    body = b""
    for name, lines in events:
        if name is not None:
            body += b"event: " + name.encode() + ending
        body += b"".join(b"data: " + line.encode() + ending for line in lines) + ending
    body += b": keep-alive" + ending
    got = anyio.run(decoded, cut(body, cuts))
    expected = [ServerSentEvent("\n".join(lines), name) for name, lines in events]
    assert got == [*expected, COMMENT]


async def test_the_decoder_keeps_the_field_rules_of_the_format() -> None:
    body = (
        "\ufeff".encode()  # a byte order mark may open the stream
        + b"data:no space\n\n"  # the space after the colon is optional
        b"data:  two spaces\n\n"  # only one is dropped
        b"data\n\n"  # a field without a colon: an empty value
        b"id: 7\nretry: 10\nunknown: x\n\n"  # other fields: no event
        b"event: named\n\n"  # a name without data: no event, and the name does not carry over
        b"data: last\n"  # the stream ends without the blank line: still an event
    )
    assert await decoded([body]) == [
        ServerSentEvent("no space"),
        ServerSentEvent(" two spaces"),
        ServerSentEvent(""),
        ServerSentEvent("last"),
    ]
