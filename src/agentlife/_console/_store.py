"""The store the console reads: opened on first use, dropped after a failure, and never a stale file.

A console outlives the files and databases it reads: an operator may delete the SQLite file, restore
another over it, or drop and recreate a PostgreSQL database while it runs. A SQLite connection keeps
reading (and writing) the file it opened even once that file is no longer at the path, so every request
checks that the file at the path is still the one open (device and inode): a missing file is the
``no store at PATH`` error (a 503 page), another file is opened in its place. An action is acknowledged
only once the same check, made after its write, shows the write went to the file at the path
(`ConsoleStore.confirm`), so a page never says "approved" for a store no operator or worker reads.

A PostgreSQL store is opened without a connection floor (``min_size=0``): the console needs no warm
connection, and asyncpg's background refill of a floor logs a traceback on every try while the database
is gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from agentlife._exceptions import StoreError
from agentlife.stores import OperatorStore, SQLiteStore, store_from_url

__all__ = ["ConsoleStore", "NotRecorded"]

log = logging.getLogger("agentlife.console")

_FileId = tuple[int, int]


class NotRecorded(StoreError):
    """The store an action was written to is no longer the one at the configured path."""


class ConsoleStore:
    """One store, opened on first use; dropped after a failure so the next request opens it again."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._store: OperatorStore | None = None
        self._file: _FileId | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> OperatorStore:
        """The store at the URL now: reopened when its SQLite file was removed or replaced.

        Raises:
            StoreError: there is no store there (``no store at PATH``) or it cannot be opened.
        """
        async with self._lock:
            if self._store is not None and not self._still_open(self._store):
                log.info("console: the SQLite file at the store's path changed; opening it again")
                await self._close_locked()
            if self._store is None:
                self._store, self._file = await self._open()
            return self._store

    async def confirm(self, store: OperatorStore) -> None:
        """Check that a write just made through ``store`` went to the store at the URL.

        Raises:
            NotRecorded: the SQLite file was removed or replaced meanwhile: the write went to the old one.
        """
        async with self._lock:
            if store is self._store and self._still_open(store):
                return
        await self.drop()
        where = store.path if isinstance(store, SQLiteStore) else "the store's URL"
        raise NotRecorded(
            f"the store at {where} was removed or replaced while the action was made, so it is not"
            " recorded there: look at the job again before you repeat it"
        )

    async def drop(self) -> None:
        """Close the store (after a failure): the next `get` opens it again."""
        async with self._lock:
            await self._close_locked()

    async def _close_locked(self) -> None:
        store, self._store, self._file = self._store, None, None
        if store is not None:
            try:
                await store.close()
            except (StoreError, OSError) as exc:
                log.debug("closing the store after a failure: %s", type(exc).__name__)

    async def _open(self) -> tuple[OperatorStore, _FileId | None]:
        store = self._new_store()
        if not isinstance(store, SQLiteStore):
            await store.open()
            return store, None
        before = _file_id(store.path)
        await store.open()  # a missing file: StoreError("no store at PATH ...")
        after = _file_id(store.path)
        if before is None or before != after:  # replaced while it was being opened: which one is open?
            await store.close()
            raise StoreError(f"the SQLite file {store.path} changed while it was opened; try again")
        return store, after

    def _new_store(self) -> OperatorStore:
        store = store_from_url(self._url, must_exist=True)  # the URL's scheme checked
        if isinstance(store, SQLiteStore):
            return store
        from agentlife.stores._postgres import PostgresStore  # asyncpg: only for postgresql:// URLs

        # One try: a page answers 503 at once rather than after a worker's connect backoff.
        return PostgresStore(self._url, min_size=0, listen=False, connect_tries=1)

    def _still_open(self, store: OperatorStore) -> bool:
        if not isinstance(store, SQLiteStore):
            return True
        return self._file is not None and _file_id(store.path) == self._file


def _file_id(path: Path) -> _FileId | None:
    """The device and inode of the file at ``path``, or None when there is none."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino
