"""The event stream's framing and its fan-out, over a follower that yields as fast as it is asked.

One follower per job however many streams; a stream resumes from a cursor the shared follower kept, and
gets a follower of its own for one it did not; a stream that falls behind the kept frames is closed; a
client that never reads its stream is closed after the write timeout while another stream of the same
job gets every frame; one stream more than the bound is a 503; the follower ends after its last stream.
The follower is a stand-in here: what is under test is what the console does with what it yields.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import orjson
import pytest
from aiohttp import web

from agentlife._console._api import Api
from agentlife._console._sse import Fanout, FellBehind, Frame, SseLimits, StreamLimit, frame
from agentlife._jobs._mask import masker_for

pytestmark = pytest.mark.anyio


class Follower:
    """Yields ``count`` frames of ``size`` bytes for any job, then (if ``end``) the end; counts its starts."""

    def __init__(
        self,
        count: int,
        size: int = 10,
        *,
        end: bool = True,
        gate: anyio.Event | None = None,
        pace: float = 0,
    ) -> None:
        self.count, self.size, self.end, self.gate, self.pace = count, size, end, gate, pace
        self.started: list[tuple[str, str | None]] = []

    async def __call__(self, job_id: str, after: str | None) -> AsyncIterator[Frame]:
        self.started.append((job_id, after))
        first = int(after.removeprefix("c")) + 1 if after is not None else 0
        for n in range(first, self.count):
            if self.gate is not None and n == 1:
                await self.gate.wait()
            if self.pace:
                await anyio.sleep(self.pace)  # a job publishing at its pace: a stream that reads keeps up
            yield Frame(f"c{n}", "published", orjson.dumps({"n": n, "pad": "x" * self.size}), seq=n)
        if self.end:
            yield Frame("end", "end", b"{}", last=True)
            return
        await anyio.sleep_forever()


async def _take(fanout: Fanout, job_id: str, after: str | None, count: int) -> list[str]:
    seq = int(after[1:]) if after is not None else None
    async with fanout.stream(job_id, after, seq) as frames:
        seen = []
        async for item in frames:
            seen.append(item.cursor)
            if len(seen) == count:
                break
        return seen


def test_a_frame_is_one_id_one_event_one_data_line_and_refuses_what_breaks_the_framing() -> None:
    assert frame("c1", "published", b'{"a":"x\\ny"}') == b'id: c1\nevent: published\ndata: {"a":"x\\ny"}\n\n'
    for kind in ("pub\nlished", "a\rb", "Ev", "x:y", "", "\x00"):
        assert b"event: message\n" in frame("c1", kind, b"{}")
    for cursor in ("c\n1", "c\r1", "c\x001", "c" * 1025):
        with pytest.raises(ValueError, match="cursor"):
            frame(cursor, "x", b"{}")


async def test_streams_of_one_job_share_its_follower_and_resume_from_a_kept_cursor() -> None:
    gate = anyio.Event()
    follow = Follower(5, gate=gate)
    async with anyio.create_task_group() as tasks:
        fanout = Fanout(follow, SseLimits(kept=10, linger=60), tasks)
        results: list[list[str]] = []

        async def one() -> None:
            results.append(await _take(fanout, "j", None, 10))

        async with anyio.create_task_group() as streams:
            for _ in range(5):
                streams.start_soon(one)
            await anyio.sleep(0.05)
            gate.set()
        assert results == [["c0", "c1", "c2", "c3", "c4", "end"]] * 5
        assert follow.started == [("j", None)] and fanout.reads == 1
        # after the job's end a stream follows it anew: a job retried after its end goes on
        assert await _take(fanout, "j", "c3", 10) == ["c4", "end"]
        assert fanout.reads == 2
        tasks.cancel_scope.cancel()


async def test_a_cursor_the_shared_follower_no_longer_keeps_gets_a_follower_of_its_own() -> None:
    follow = Follower(5, end=False)  # a job still running after five events
    async with anyio.create_task_group() as tasks:
        fanout = Fanout(follow, SseLimits(kept=3, linger=60), tasks)
        async with fanout.stream("j", None):  # the shared follower reads everything, keeps the last 3
            with anyio.fail_after(10):
                while fanout._channels["j"].base + len(fanout._channels["j"].frames) < 5:
                    await anyio.sleep(0.01)
            assert [f.cursor for f in fanout._channels["j"].frames] == ["c2", "c3", "c4"]
            assert await _take(fanout, "j", "c3", 1) == ["c4"]  # kept: joins the shared follower
            assert fanout.reads == 1
            assert await _take(fanout, "j", "c0", 4) == ["c1", "c2", "c3", "c4"]  # not kept: its own
            assert follow.started[-1] == ("j", "c0") and fanout.reads == 2
            assert await _take(fanout, "j", None, 5) == ["c0", "c1", "c2", "c3", "c4"]  # the start: its own
            assert fanout.reads == 3
        tasks.cancel_scope.cancel()


async def test_a_rejoin_starts_the_shared_follower_at_its_cursor_and_later_cursors_join_it() -> None:
    follow = Follower(8, end=False)
    async with anyio.create_task_group() as tasks:
        fanout = Fanout(follow, SseLimits(kept=100, linger=60), tasks)
        async with fanout.stream("j", "c5", 5) as frames:  # the job's history is not read again
            assert [(await frames.__anext__()).cursor for _ in range(2)] == ["c6", "c7"]
            assert await _take(fanout, "j", "c6", 1) == ["c7"]  # a later cursor joins it
            assert follow.started == [("j", "c5")] and fanout.reads == 1
            assert await _take(fanout, "j", "c2", 3) == ["c3", "c4", "c5"]  # an earlier one: its own
            assert await _take(fanout, "j", None, 1) == ["c0"]
            assert follow.started[1:] == [("j", "c2"), ("j", None)] and fanout.reads == 3
        tasks.cancel_scope.cancel()


async def test_a_stream_that_falls_behind_the_kept_frames_is_closed_the_others_go_on() -> None:
    gate = anyio.Event()
    follow = Follower(50, gate=gate, pace=0.005)
    async with anyio.create_task_group() as tasks:
        fanout = Fanout(follow, SseLimits(kept=5, linger=60), tasks)
        async with fanout.stream("j", None) as slow:
            first = await slow.__anext__()  # c0; the follower then runs ahead while this stream sleeps
            assert first.cursor == "c0"
            fast = await _take_after_gate(fanout, gate)
            assert fast == [f"c{n}" for n in range(1, 50)] + ["end"]
            with pytest.raises(FellBehind):
                await slow.__anext__()
        tasks.cancel_scope.cancel()


async def _take_after_gate(fanout: Fanout, gate: anyio.Event) -> list[str]:
    async with fanout.stream("j", "c0") as frames:  # joins the shared follower after c0
        gate.set()
        return [item.cursor async for item in frames]


async def test_the_stream_bound_and_the_follower_ends_after_its_last_stream() -> None:
    follow = Follower(1, end=False)
    async with anyio.create_task_group() as tasks:
        fanout = Fanout(follow, SseLimits(max_streams=2, linger=0.05), tasks)
        async with fanout.stream("a", None), fanout.stream("b", None):
            with pytest.raises(StreamLimit, match="2 event streams"):
                async with fanout.stream("c", None):
                    pass
        with anyio.fail_after(10):  # the followers of a and b stop once unused (linger 0.05 s)
            while fanout._channels:
                await anyio.sleep(0.02)
        async with fanout.stream("c", None) as frames:  # the bound counts open streams only
            assert (await frames.__anext__()).cursor == "c0"
        tasks.cancel_scope.cancel()


class _Clients:
    """The client the stream asks whether the job exists: every job does."""

    async def get(self, job_id: str | None = None) -> _Clients:
        return self


class _Follower:
    """Every cursor is accepted."""

    def __init__(self, follow: Follower) -> None:
        self.follow = follow

    async def check(self, job_id: str, after: str | None) -> int | None:
        return None


@asynccontextmanager
async def _server(follow: Follower, limits: SseLimits) -> AsyncIterator[tuple[str, Fanout, web.AppRunner]]:
    async with anyio.create_task_group() as tasks:
        fanout = Fanout(follow, limits, tasks)
        clients: Any = _Clients()
        api = Api(clients, _Follower(follow), masker_for({}, "sqlite:///x"), None, lambda: fanout, limits)
        app = web.Application()
        app.router.add_get("/events/{job_id}", api.events)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            yield f"http://{host}:{port}", fanout, runner
        finally:
            await runner.cleanup()
            tasks.cancel_scope.cancel()


async def test_a_client_that_never_reads_is_closed_and_costs_another_stream_nothing() -> None:
    gate = anyio.Event()
    follow = Follower(400, size=20_000, gate=gate)  # 8 MB: more than the deaf socket's buffers hold
    limits = SseLimits(heartbeat=5, write_timeout=0.5, kept=1000, linger=60)
    async with _server(follow, limits) as (url, fanout, runner):
        port = int(url.rsplit(":", 1)[1])
        deaf = socket.create_connection(("127.0.0.1", port))
        deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        deaf.sendall(b"GET /events/j HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            async with (
                httpx.AsyncClient(timeout=30) as http,
                http.stream("GET", f"{url}/events/j") as response,
            ):
                with anyio.fail_after(10):
                    while fanout._open < 2:
                        await anyio.sleep(0.01)
                gate.set()  # both streams joined: the job goes on
                ids = [line[4:] async for line in response.aiter_lines() if line.startswith("id: ")]
            assert ids == [f"c{n}" for n in range(400)] + ["end"]
            with anyio.fail_after(20):  # the deaf stream is closed by its write timeout, its connection too
                while fanout._open or (runner.server is not None and runner.server.connections):
                    await anyio.sleep(0.05)
            assert fanout.reads == 1
        finally:
            deaf.close()
