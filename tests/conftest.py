"""Shared fixtures. Async tests run on anyio's asyncio backend."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


from _pg import *  # noqa: E402, F403 - PostgreSQL fixtures (postgres_server, postgres_url)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Start the ``slow`` tests (tens of seconds each) first, one at the head of each worker's share.

    pytest-xdist hands each of its workers a contiguous share of this order and lets idle ones steal from
    the tail of the others': with a slow test at the head of every share they run side by side while the
    short tests fill the gaps, instead of one starting last and running alone. The order is computed the
    same way on every worker, as xdist requires.
    """
    slow = sorted((item for item in items if item.get_closest_marker("slow")), key=_seconds, reverse=True)
    rest = [item for item in items if item.get_closest_marker("slow") is None]
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for item in slow:  # longest first, each to the share with the fewest seconds so far
        min(shares, key=lambda share: sum(map(_seconds, share))).append(item)
    left = len(items)
    for n, share in enumerate(shares):
        size = left // (workers - n)  # how xdist sizes the shares, in this order
        take = max(0, size - len(share))
        share.extend(rest[:take])
        del rest[:take]
        left -= size
    shares[-1].extend(rest)
    items[:] = [item for share in shares for item in share]


def _seconds(item: pytest.Item) -> float:
    """A slow test's rough duration, ``@pytest.mark.slow(seconds)`` (10 when not given)."""
    marker = item.get_closest_marker("slow")
    return float(marker.args[0]) if marker is not None and marker.args else 10.0


# The end-to-end worlds' fixtures (db_url over both stores, procs), for every test module that asks.
pytest_plugins = ["world"]
