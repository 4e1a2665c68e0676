"""agentlife's HTTP/1.1 client for a model server on this machine, against servers that lie.

Each server is a few lines of ``asyncio.start_server`` writing exactly the bytes a test chooses: framing
that is almost right, lengths that are wrong, heads that never end, a stall after the head.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.lowlevel
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlife import TransientError
from agentlife._llm import _loopback_http as wire
from agentlife._llm._openai import OpenAICompatibleLLM
from agentlife._llm._transport import HttpxTransport, Transport, TransportError, TransportTimeout
from agentlife._retry import ErrorClass, classify

pytestmark = pytest.mark.anyio

Respond = Callable[[asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(respond: Respond | bytes) -> AsyncIterator[tuple[str, list[bytes], list[bool]]]:
    """A server on 127.0.0.1 writing ``respond``'s bytes; yields (base URL, requests, hung-up flags)."""
    requests: list[bytes] = []
    hung_up: list[bool] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            requests.append(head + await reader.readexactly(length))
            if isinstance(respond, bytes):
                writer.write(respond)
            else:
                await respond(writer)
            await writer.drain()
            if isinstance(respond, bytes):
                writer.write_eof()  # all it had to say: a body cut short is cut here
            hung_up.append(await reader.read(1) == b"")  # the client closes its end
        except (ConnectionError, asyncio.IncompleteReadError):
            hung_up.append(True)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", requests, hung_up
    finally:
        server.close()


async def fetch(url: str, *, timeout: float = 5.0) -> tuple[int, wire.Headers, bytes]:
    client = wire.Client(headers={"x-api-key": "k"}, connect_timeout=timeout, read_timeout=timeout)
    response = await client.send(client.build_request("POST", f"{url}/v1/x", content=b"{}"))
    return response.status_code, response.headers, await response.aread()


OK = b"HTTP/1.1 200 OK\r\n"


async def test_the_request_is_one_http_1_1_post_with_its_length_host_and_no_keep_alive() -> None:
    async with raw_server(OK + b"content-length: 2\r\n\r\nok") as (url, requests, _):
        client = wire.Client(headers={"X-Api-Key": "k", "accept": "a"})
        request = client.build_request(
            "POST",
            f"{url}/v1/messages?beta=1",
            content=b'{"a":1}',
            headers={"accept": "b"},
            params={"q": "x y"},
        )
        response = await client.send(request)
        assert (response.status_code, await response.aread()) == (200, b"ok")
    head, body = requests[0].split(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/messages?beta=1&q=x+y HTTP/1.1" and body == b'{"a":1}'
    fields = dict(line.split(": ", 1) for line in lines[1:])
    assert fields["x-api-key"] == "k" and fields["accept"] == "b"  # the request's own header wins
    assert fields["host"] == url.removeprefix("http://") and fields["content-length"] == "7"
    assert fields["connection"] == "close" and fields["accept-encoding"] == "identity"


async def test_a_chunked_body_sent_a_byte_at_a_time_with_extensions_and_trailers_is_read_whole() -> None:
    body = b"5;name=value\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nx-trailer: 1\r\n\r\n"

    async def trickle(writer: asyncio.StreamWriter) -> None:
        for byte in OK + b"Transfer-Encoding: chunked\r\n\r\n" + body:
            writer.write(bytes([byte]))
            await writer.drain()

    async with raw_server(trickle) as (url, _, _):
        assert await fetch(url) == (200, wire.Headers([("transfer-encoding", "chunked")]), b"hello world")


@pytest.mark.parametrize("size", [b"0x5", b"5_0", b"-5", b" ", b"1" * 17, b"5 5", b"\xff"])
async def test_a_chunk_size_that_is_not_plain_hex_is_refused(size: bytes) -> None:
    async with raw_server(OK + b"transfer-encoding: chunked\r\n\r\n" + size + b"\r\nhello\r\n0\r\n\r\n") as (
        url,
        *_,
    ):
        with pytest.raises(wire.RemoteProtocolError, match="not a chunk size"):
            await fetch(url)


@pytest.mark.parametrize(
    ("framing", "match"),
    [
        (b"content-length: 10\r\n\r\nshort", "5 bytes before the end of its content-length"),
        (b"transfer-encoding: chunked\r\n\r\n10\r\nshort", "bytes before the end of a chunk"),
        (b"transfer-encoding: chunked\r\n\r\n2\r\nlonger\r\n0\r\n\r\n", "longer than its size"),
        (b"transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n", "closed before"),
        (b"content-length: 2, 3\r\n\r\nok", "conflicting content-lengths"),
        (b"content-length: +2\r\n\r\nok", "not a content-length"),
        (b"content-length: 99999999999999999999\r\n\r\nok", "not a content-length"),
        (b"transfer-encoding: gzip, chunked\r\n\r\n", "unsupported transfer-encoding"),
        (b"content-encoding: gzip\r\ncontent-length: 2\r\n\r\nok", "'gzip'-encoded body"),
    ],
)
async def test_a_body_cut_short_or_framed_wrong_is_a_protocol_error(framing: bytes, match: str) -> None:
    async with raw_server(OK + framing) as (url, *_):
        with pytest.raises(wire.RemoteProtocolError, match=match):
            await fetch(url)


@pytest.mark.parametrize(
    ("head", "match"),
    [
        (b"HTTP/2 200 OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"ICY 200 OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "not a header field"),
        (b"HTTP/1.1 200 OK\r\n folded: value\r\n\r\n", "not a header field"),
        (b"HTTP/1.1 200 OK\r\nx: " + b"a" * 70_000 + b"\r\n\r\n", "passed 65536 bytes"),
        (b"HTTP/1.1 200 OK\r\n" + b"x: 1\r\n" * 300 + b"\r\n", "over 256 header fields"),
        (b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n", "closed before the response's head"),
        (b"", "closed before the response's head"),
    ],
)
async def test_a_head_that_is_not_http_1_1_or_never_ends_is_a_protocol_error(head: bytes, match: str) -> None:
    async with raw_server(head) as (url, *_):
        with pytest.raises(wire.RemoteProtocolError, match=match):
            await fetch(url)


async def test_interim_responses_are_skipped_and_headers_read_without_regard_to_case() -> None:
    head = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: x\r\n\r\n"
    final = b"HTTP/1.1 429 Too Many\r\nRetry-After: 3\r\nX-A: 1\r\nx-a: 2\r\n\r\n"
    async with raw_server(head + final + b"until the end") as (url, *_):
        status, headers, body = await fetch(url)
    assert (status, body) == (429, b"until the end")  # no framing: the body runs to the close
    assert headers.get("retry-after") == "3" and headers["X-A"] == "1, 2" and "link" not in headers
    repeated = wire.Headers([("x-big", "v" * 60_000)] * 256)  # the most a head may hold, one name
    assert len(repeated["X-Big"]) == 256 * 60_000 + 255 * 2
    assert "3" not in repr(headers)  # names only: a value may be a secret


async def test_a_stall_after_the_head_is_a_timeout_and_closing_hangs_up_at_once() -> None:
    async def stall(writer: asyncio.StreamWriter) -> None:
        writer.write(OK + b"transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()

    async with raw_server(stall) as (url, _, hung_up):
        client = wire.Client(read_timeout=0.3)
        response = await client.send(client.build_request("POST", url, content=b""))
        pieces = response.aiter_bytes()
        assert await pieces.__anext__() == b"hello"
        with pytest.raises(wire.TimeoutException, match="no data from the server"):
            await pieces.__anext__()
        with anyio.fail_after(5):
            while not hung_up:
                await anyio.sleep(0.01)
    assert hung_up == [True]


async def test_a_refused_connection_and_a_line_break_in_a_header_fail_before_any_byte() -> None:
    with socket_closed_port() as port:
        client = wire.Client(connect_timeout=5)
        with pytest.raises(wire.ConnectError):
            await client.send(client.build_request("POST", f"http://127.0.0.1:{port}/", content=b""))
    with pytest.raises(wire.HTTPError, match="line break"):
        client.build_request("POST", "http://127.0.0.1:1/", headers={"x": "a\r\nx-injected: 1"})
    with pytest.raises(wire.HTTPError, match="not an http:// URL"):
        client.build_request("POST", "https://127.0.0.1:1/")


async def _pieces(data: bytes, cuts: list[int]) -> AsyncIterator[bytes]:
    start = 0
    for cut in sorted(set(cuts)):
        yield data[start:cut]
        start = cut
    yield data[start:]


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.text(alphabet="ab\r\n é", max_size=12), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=20),
)
def test_lines_split_the_same_however_the_bytes_are_cut(lines: list[str], cuts: list[int]) -> None:
    data = "".join(lines).encode()

    async def split() -> list[str]:
        return [line async for line in wire.split_lines(_pieces(data, cuts), 1 << 20)]

    assert anyio.run(split) == [line.decode() for line in data.splitlines()]


async def test_a_long_line_sent_a_byte_at_a_time_costs_time_linear_in_its_length() -> None:
    line = b"x" * 1_000_000 + b"\n"

    async def bytes_one_by_one() -> AsyncIterator[bytes]:
        for i in range(len(line)):
            if i % 10_000 == 0:
                await anyio.lowlevel.checkpoint()  # where the deadline below can land
            yield line[i : i + 1]

    with anyio.fail_after(60):  # gathered by joining the pieces once: a copy per byte would take hours
        assert [len(x) async for x in wire.split_lines(bytes_one_by_one(), 1 << 21)] == [1_000_000]
    with pytest.raises(wire.RemoteProtocolError, match="without an end"):
        async for _ in wire.split_lines(_pieces(b"y" * 5000, [1000, 2000, 3000]), 4096):
            pass


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nx-echo authorization Bearer {key}\r\n\r\n",  # a field without its colon
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz {key}\r\n",  # a chunk size
        b"HTTP/9 {key}\r\n\r\n",  # a status line
        b"HTTP/1.1 200 OK\r\ncontent-length: 1, 2 {key}\r\n\r\n",  # a content-length
        b"HTTP/1.1 200 OK\r\ncontent-encoding: x {key}\r\ncontent-length: 1\r\n\r\nx",  # an encoding
    ],
)
async def test_no_piece_of_a_secret_a_server_echoes_reaches_an_error(head: bytes) -> None:
    """A message that cut the server's line to fit would hand on a piece of the key no redactor can
    recognise: none of the server's bytes are repeated, beyond a short word."""
    key = "k3y-" + "q" * 12 + "-loopback-secret-0123456789"
    async with raw_server(head.replace(b"{key}", key.encode())) as (url, *_):
        with pytest.raises(wire.RemoteProtocolError) as caught:
            await fetch(url)
    message = str(caught.value)
    assert not any(key[i : i + 6] in message for i in range(len(key) - 5)), message


def test_its_errors_are_sorted_as_httpx_errors_are() -> None:
    assert classify(wire.TimeoutException("slow")) is ErrorClass.TIMEOUT
    assert classify(wire.RemoteProtocolError("cut")) is ErrorClass.TRANSIENT
    assert classify(wire.ConnectError("refused")) is ErrorClass.TRANSIENT
    assert issubclass(wire.TimeoutException, wire.HTTPError)


async def test_an_adapter_turns_a_lying_stream_into_a_transient_error_without_the_key() -> None:
    key = "sk-loopback-secret-0123456789abcdef"
    framing = b"content-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"
    async with raw_server(OK + framing) as (url, requests, _):
        llm = OpenAICompatibleLLM(f"{url}/v1", api_key=key)
        with pytest.raises(TransientError) as caught:
            await llm.complete(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        await llm.aclose()
    assert "not a chunk size" in str(caught.value) and key not in str(caught.value)
    assert f"authorization: Bearer {key}".encode() in requests[0]


class socket_closed_port:
    """A port nothing listens on (bound, then closed)."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        pass


def _transport(which: str, read_timeout: float) -> Transport:
    # A connect gets room (a loaded machine's first connect can be slow); a read stalls on purpose.
    if which == "loopback":
        return wire.Client(connect_timeout=15.0, read_timeout=read_timeout)
    return HttpxTransport(httpx, httpx.AsyncClient(timeout=httpx.Timeout(15.0, read=read_timeout)))


@pytest.mark.parametrize("which", ["loopback", "httpx"])
async def test_both_transports_raise_the_same_two_errors_wherever_the_request_breaks(which: str) -> None:
    # The adapters catch only TransportError and TransportTimeout: httpx's own exceptions are translated at
    # the edge (sending, and reading the body), so none reaches an adapter or the retry classifier raw.
    transport = _transport(which, read_timeout=0.3)

    async def stall(writer: asyncio.StreamWriter) -> None:
        writer.write(OK + b"content-length: 5\r\n\r\nhe")

    try:
        async with raw_server(OK + b"content-length: 100\r\n\r\nshort") as (url, *_):
            response = await transport.stream("POST", f"{url}/v1/x", content=b"{}", headers={})
            with pytest.raises(TransportError) as cut:
                await response.aread()
        async with raw_server(stall) as (url, *_):
            response = await transport.stream("POST", f"{url}/v1/x", content=b"{}", headers={})
            with pytest.raises(TransportTimeout) as stalled:
                await response.aread()
        with socket_closed_port() as port, pytest.raises(TransportError) as refused:
            await transport.stream("POST", f"http://127.0.0.1:{port}/", content=b"", headers={})
    finally:
        await transport.aclose()
    assert not isinstance(cut.value, TimeoutError) and not isinstance(refused.value, TimeoutError)
    for caught in (cut, stalled, refused):
        assert type(caught.value).__module__.startswith("agentlife."), caught.value
    assert classify(cut.value) is ErrorClass.TRANSIENT and classify(stalled.value) is ErrorClass.TIMEOUT
