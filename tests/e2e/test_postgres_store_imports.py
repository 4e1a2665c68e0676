"""PostgresStore beyond the shared contract: outages, the pool, schemas, secrets (real PostgreSQL server)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.anyio


def test_importing_the_store_does_not_import_asyncpg() -> None:
    code = (
        "import sys, agentlife, agentlife.stores;"
        "from agentlife.stores import store_from_url;"
        "store_from_url('postgresql://u:p@127.0.0.1/db');"
        "assert 'asyncpg' not in sys.modules, 'asyncpg imported before open()'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
