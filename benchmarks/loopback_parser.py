"""The loopback client's first request, parsed by its own HTTP/1.1 reader or by h11: which costs less?

Run: ``python benchmarks/loopback_parser.py``. A server on this process's own thread answers every request
with the same chunked Server-Sent Events stream (40 events, as a short model reply). Each run spawns a fresh
``python -c`` that imports the client (``hand``: ``agentlife._llm._loopback_http``; ``h11``: h11 and a
minimal client written on it here, bounded as the loopback client is), sends one POST and reads the body's
lines to the end. Figures, the median of interleaved runs:

* ``first request``: from before the client's import to the last line read, measured inside the child
  (the interpreter, anyio and agentlife, loaded before any model request and common to both, excluded);
* ``spawn -> exit``: the whole child, as a pod pays it;
* ``warm request``: a second request in the same child (the parse alone, imports paid).
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import threading
import time

RUNS = 21
EVENTS = 40


def _stream() -> bytes:
    events = b"".join(
        b'data: {"choices":[{"delta":{"content":"token %d "},"index":0}]}\n\n' % n for n in range(EVENTS)
    )
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(events[i : i + 512]), events[i : i + 512]) for i in range(0, len(events), 512)
    )
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + chunks + b"0\r\n\r\n"


RESPONSE = _stream()

# What the run path has loaded before its first model request, and the seam both clients implement.
COMMON = "import time, asyncio, anyio, agentlife, agentlife._llm._transport\nt0 = time.perf_counter()\n"

HAND = """
from agentlife._llm._loopback_http import Client

async def fetch(url):
    client = Client(connect_timeout=5, read_timeout=5)
    response = await client.stream("POST", url, content=b"{}", headers={"content-type": "application/json"})
    return [line async for line in response.aiter_lines()]
"""

H11 = """
import h11

async def fetch(url):
    host, port = url.split("//")[1].split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port), limit=65536)
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=65536)
    headers = [("host", f"{host}:{port}"), ("content-type", "application/json"), ("content-length", "2"),
               ("accept-encoding", "identity"), ("connection", "close")]
    writer.write(conn.send(h11.Request(method="POST", target="/v1/chat/completions", headers=headers)))
    writer.write(conn.send(h11.Data(data=b"{}")) + conn.send(h11.EndOfMessage()))
    await writer.drain()
    lines, rest = [], b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            with anyio.fail_after(5):  # as the loopback client bounds each read
                conn.receive_data(await reader.read(65536))
            continue
        if isinstance(event, h11.Data):
            rest += bytes(event.data)
            *done, rest = rest.split(b"\\n")
            lines += [line.decode() for line in done]
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            break
    writer.transport.abort()
    return lines
"""

MEASURE = """
async def main(url):
    lines = await fetch(url)
    t1 = time.perf_counter()
    again = await fetch(url)
    t2 = time.perf_counter()
    assert len(lines) >= {events} and lines == again, len(lines)
    print(t1 - t0, t2 - t1)

asyncio.run(main({url!r}))
"""


class Server:
    """Answers every connection with `RESPONSE` once the request's head and body arrived."""

    def __init__(self) -> None:
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)

    def __enter__(self) -> Server:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(RESPONSE)
        await writer.drain()
        writer.close()


def _run(variant: str, url: str) -> tuple[float, float, float]:
    code = COMMON + (HAND if variant == "hand" else H11) + MEASURE.format(events=EVENTS, url=url)
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    total = time.perf_counter() - start
    first, warm = (float(x) for x in out.stdout.split())
    return first, total, warm


def main() -> None:
    results: dict[str, list[tuple[float, float, float]]] = {"hand": [], "h11": []}
    with Server() as server:
        for variant in results:  # warm the disk caches and the .pyc files once
            _run(variant, server.url)
        for _ in range(RUNS):
            for variant in results:
                results[variant].append(_run(variant, server.url))
    print(f"median of {RUNS} interleaved runs, {EVENTS} SSE events, {len(RESPONSE)} bytes chunked")
    for name, index in (("first request", 0), ("spawn -> exit", 1), ("warm request", 2)):
        hand = statistics.median(r[index] for r in results["hand"]) * 1000
        h11 = statistics.median(r[index] for r in results["h11"]) * 1000
        print(f"{name:14} hand {hand:7.2f} ms   h11 {h11:7.2f} ms   h11/hand {h11 / hand:5.2f}x")


if __name__ == "__main__":
    main()
