"""Shared fixtures. Async tests run on anyio's asyncio backend."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


from _pg import *  # noqa: E402, F403 - PostgreSQL fixtures (postgres_server, postgres_url)

# The end-to-end worlds' fixtures (db_url over both stores, procs), for every test module that asks.
pytest_plugins = ["world"]
