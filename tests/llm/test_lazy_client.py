"""The model clients' httpx client is built once, off the loop; concurrent first calls share one."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import httpx
import pytest

from agentlife._llm._http import LazyClient
from agentlife._llm._transport import HttpxTransport

pytestmark = pytest.mark.anyio


async def test_concurrent_first_calls_share_one_client_and_close_the_spare() -> None:
    built: list[httpx.AsyncClient] = []
    both_building = threading.Barrier(2, timeout=5)

    def build() -> HttpxTransport:
        both_building.wait()  # both first calls are building at once: one client must be closed
        client = httpx.AsyncClient()
        built.append(client)
        return HttpxTransport(httpx, client)

    lazy = LazyClient(build)
    got: list[Any] = []

    async def first_call() -> None:
        got.append(await lazy.get())

    async with anyio.create_task_group() as tg:
        tg.start_soon(first_call)
        tg.start_soon(first_call)
    assert len(built) == 2 and got[0] is got[1]
    kept = got[0].client
    (spare,) = [c for c in built if c is not kept]
    assert spare.is_closed and not kept.is_closed
    assert await lazy.get() is got[0]  # built once: later calls build nothing
    await lazy.aclose()
    await lazy.aclose()  # idempotent
    assert kept.is_closed


async def test_a_build_that_fails_fails_the_call_and_the_next_call_tries_again() -> None:
    attempts: list[int] = []

    def build() -> HttpxTransport:
        attempts.append(1)
        if len(attempts) == 1:
            raise ValueError("bad base URL")
        return HttpxTransport(httpx, httpx.AsyncClient())

    lazy = LazyClient(build)
    with pytest.raises(ValueError, match="bad base URL"):
        await lazy.get()
    transport = await lazy.get()
    assert isinstance(transport, HttpxTransport) and not transport.client.is_closed and len(attempts) == 2
    await lazy.aclose()
