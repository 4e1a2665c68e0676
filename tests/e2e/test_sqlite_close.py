"""Closing the SQLite store while statements run on worker threads must not crash the interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

RACE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import anyio
    from agentlife import StoreUnavailable
    from agentlife.stores import SQLiteStore

    async def one_round(path):
        store = SQLiteStore(path)
        await store.open()
        await store.create_job("j", "a", None)
        await store.claim("j", 1)

        async def write():
            for _ in range(50):
                try:
                    await store.write_checkpoint("j", 1, "c", 0, b"x" * 20000)
                except StoreUnavailable:
                    return

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(write)
            await anyio.sleep(0.001)
            await store.close()  # while the writers' statements are in flight on worker threads

    async def main():
        for i in range(150):
            await one_round(Path(sys.argv[1]) / f"db{i % 3}.sqlite")

    anyio.run(main)
    print("survived")
    """
)


def test_close_during_in_flight_statements_does_not_segfault(tmp_path: Path) -> None:
    # In a child process: a use-after-free in sqlite3 would take the whole test run down with it.
    result = subprocess.run(
        [sys.executable, "-c", RACE, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert result.stdout.strip() == "survived"
