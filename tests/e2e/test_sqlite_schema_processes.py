"""Making a new SQLite store: the schema in one transaction, and several processes making one file at once."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.anyio

OPEN_AND_CREATE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import anyio
    from agentlife.stores import SQLiteStore

    async def main() -> None:
        store = SQLiteStore(Path(sys.argv[1]))
        await store.open()
        await store.create_job(sys.argv[2], "agent", {"n": 1})
        await store.close()

    anyio.run(main)
    """
)


def test_processes_making_one_new_store_at_once_all_open_it(tmp_path: Path) -> None:
    # Each waits for the one making the schema (the write lock is taken first), then finds it all there:
    # none fails on a table another made between its check and its write.
    path = tmp_path / "agentlife.db"
    procs = [
        subprocess.Popen([sys.executable, "-c", OPEN_AND_CREATE, str(path), name], stderr=subprocess.PIPE)
        for name in (f"job-{i}" for i in range(4))
    ]
    errors = [p.communicate(timeout=60)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
    with sqlite3.connect(path) as conn:
        assert sorted(row[0] for row in conn.execute("SELECT id FROM job")) == [f"job-{i}" for i in range(4)]
