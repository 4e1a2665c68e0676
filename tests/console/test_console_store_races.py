"""The store the console reads is the one at its configured path or URL, now, never a stale copy.

With real console processes: a SQLite file deleted while the console runs is the documented error page
(503, ``no store at``) and a new store made at the path is read; a file replaced by another (a restored
backup) is read, and an approval made from the page lands in the store that operators and workers read,
never in the deleted file the console's connection held. An action whose write raced a replacement is
not acknowledged (the race is held still in-process, where it can be). A PostgreSQL database dropped
while the console runs answers 503 with one line in the log, no traceback, and is read again once it is
back.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from agentlife._console._store import ConsoleStore, NotRecorded
from agentlife.stores import ApprovalRequest, store_from_url


def _remove_store(db: Path) -> None:
    """What an operator does to take a SQLite store away: the file and its WAL and shared-memory files."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def _parked_store(db: Path, job_id: str) -> None:
    """A store at ``db`` holding ``job_id`` parked on an approval of call ``{job_id}/0/1``."""
    url = f"sqlite:///{db}"

    async def park() -> None:
        store = store_from_url(url)
        await store.open()  # makes the file and its tables, as `db init` does
        try:
            await store.create_job(job_id, "deployer", {})
            await store.claim(job_id, 1)
            await store.request_approval(job_id, 1, ApprovalRequest(f"{job_id}/0/1", "d1", "deploy", 0, 1))
        finally:
            await store.close()

    anyio.run(park)


def test_an_action_whose_write_raced_a_replaced_file_is_not_acknowledged(tmp_path: Path) -> None:
    db = tmp_path / "agentlife.db"
    _parked_store(db, "park")
    replacement = tmp_path / "other" / "agentlife.db"
    replacement.parent.mkdir()
    _parked_store(replacement, "park")

    async def race() -> None:
        console = ConsoleStore(f"sqlite:///{db}")
        try:
            store = await console.get()
            _remove_store(db)  # a backup restored between the check before the write and the write
            os.replace(replacement, db)
            await store.approve("park", invocation_id="park/0/1", digest="d1")
            with pytest.raises(NotRecorded, match="not recorded"):
                await console.confirm(store)
            fresh = await console.get()  # the next request reads the file at the path
            assert fresh is not store
            state = await fresh.get_approval("park")
            assert state is not None and state.status == "WAITING_FOR_APPROVAL"
            await fresh.approve("park", invocation_id="park/0/1", digest="d1")
            await console.confirm(fresh)  # a write to the file at the path is acknowledged
        finally:
            await console.drop()

    anyio.run(race)
