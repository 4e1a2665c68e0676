"""Shared fixtures. Async tests run on anyio's asyncio backend."""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# Test modules import the support modules of tests/ (world, procs, agents, ...) and each other's helpers
# (``from test_worker import ...``) by bare name: tests/ and every folder under it that holds tests are on
# sys.path, as pytest's default import mode does for a test file's own folder when it imports the file. The
# folders have no ``__init__.py`` (a ``tests/mcp`` package would hide the ``mcp`` SDK), so a test file's name
# must be unique across the suite (tests/test_tests_layout.py checks it).
_TESTS = Path(__file__).resolve().parent
for _folder in [_TESTS, *sorted(p for p in _TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))]:
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark every test under tests/e2e/ ``e2e``: ``pytest -m 'not e2e'`` runs the in-process suite alone.

    Applied as each item is collected, so the marker is there before ``-m`` deselects anything.
    """
    if (_TESTS / "e2e") in item.path.parents:
        item.add_marker(pytest.mark.e2e)


from _pg import *  # noqa: E402, F403 - PostgreSQL fixtures (postgres_server, postgres_url)

#: ``AGENTLIFE_TESTS_EXHAUSTIVE=1`` (the nox ``chaos`` session) runs every variant; the suite runs fewer.
EXHAUSTIVE = os.environ.get("AGENTLIFE_TESTS_EXHAUSTIVE") == "1"
#: The fixtures that run a real-process test once per store ("sqlite", "postgresql").
STORE_FIXTURES = frozenset({"db_url", "db", "cli", "any_url", "shared_url"})
STORES = frozenset({"sqlite", "postgresql"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the variants only the exhaustive run needs, then order what is left (`_spread_slow`).

    Left out (reported as deselected, never skipped): a test or parameter marked ``exhaustive`` (a second
    seed, the long chaos sizes), and all but one store of a real-process test parametrized over both by a
    store fixture. Which store a test keeps follows from its name, so the suite runs each test on the same
    store every time and about half of them on each; the store contract suites, which run in-process, keep
    both stores always.
    """
    if not EXHAUSTIVE:
        kept = _short_run(items)
        if len(kept) < len(items):
            chosen = set(kept)
            config.hook.pytest_deselected(items=[item for item in items if item not in chosen])
            items[:] = kept
        _fewer_examples(items)
    _spread_slow(items)


def _short_run(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items without ``exhaustive``, each store-parametrized test on one store where it has both."""
    items = [item for item in items if item.get_closest_marker("exhaustive") is None]
    groups: dict[str, dict[str, pytest.Item]] = {}
    for item in items:
        store, group = _store_variant(item)
        if store is not None:
            groups.setdefault(group, {})[store] = item
    dropped = set()
    for group, by_store in groups.items():
        if len(by_store) == len(STORES):
            keep = sorted(STORES)[zlib.crc32(group.encode()) % len(STORES)]
            dropped.update(item for store, item in by_store.items() if store != keep)
    return [item for item in items if item not in dropped]


#: The suite runs a property test on this share of the examples its ``settings`` ask (at least
#: `FEWEST_EXAMPLES`); the exhaustive run on all of them. A shrunk failure is replayed first either way.
EXAMPLES_SHARE, FEWEST_EXAMPLES = 3, 25


def _fewer_examples(items: list[pytest.Item]) -> None:
    """Give each hypothesis test ``max_examples // EXAMPLES_SHARE`` (once per test function).

    Hypothesis reads a test's settings from ``_hypothesis_internal_use_settings`` when the test runs; a
    hypothesis that stops doing so fails here rather than running every example unnoticed.
    """
    done: set[int] = set()
    for item in items:
        test = getattr(item, "function", None)
        if not getattr(test, "is_hypothesis_test", False) or id(test) in done:
            continue
        done.add(id(test))
        from hypothesis import settings

        current = test._hypothesis_internal_use_settings  # type: ignore[union-attr]
        fewer = min(current.max_examples, max(FEWEST_EXAMPLES, current.max_examples // EXAMPLES_SHARE))
        test._hypothesis_internal_use_settings = settings(current, max_examples=fewer)  # type: ignore[union-attr]


def _store_variant(item: pytest.Item) -> tuple[str | None, str]:
    """The store a test runs on through a store fixture (or None), and its name without the store."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None, item.nodeid
    stores = [value for name, value in callspec.params.items() if name in STORE_FIXTURES and value in STORES]
    others = "-".join(part for part in callspec.id.split("-") if part not in STORES)
    return (stores[0] if stores else None), f"{item.path.name}::{item.originalname}[{others}]"


def _spread_slow(items: list[pytest.Item]) -> None:
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
