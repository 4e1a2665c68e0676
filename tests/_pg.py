"""A real, throwaway PostgreSQL server for tests and benchmarks.

`PostgresServer` runs ``initdb`` and ``pg_ctl`` from the server binaries on PATH in a temporary directory,
listening on a free 127.0.0.1 port with a password-authenticated (SCRAM) superuser. As root it runs them as
the ``postgres`` system user, because PostgreSQL refuses to run as root. `running_postgres` wraps it as a
context manager usable outside pytest (benchmarks import it); the pytest fixtures are:

- ``postgres_server`` (session): the running `PostgresServer`; ``stop()`` / ``start()`` / ``stopped()`` take
  it down and bring it back on the same port and data directory, for "PostgreSQL stopped mid-run" tests.
- ``postgres_url`` (function): a URL whose unqualified tables live in a fresh, empty schema (``search_path``).

Missing binaries make the fixture fail with a clear message: a store test that silently skips proves nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["PostgresServer", "PostgresUnavailable", "postgres_server", "postgres_url", "running_postgres"]

_T = TypeVar("_T")
_BINARIES = ("initdb", "pg_ctl")
_FAST_SETTINGS = {
    # A test server never needs to survive a power cut; these make initdb and every commit cheap.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "16MB",
    "max_connections": "60",
    "max_wal_senders": "0",
    "wal_level": "minimal",
    "autovacuum": "off",
}


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL server binaries are missing or the server would not start."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_async(factory: Callable[[], Awaitable[_T]]) -> _T:
    """Run a coroutine on a private loop in a private thread, so it never touches a test's own loop."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(_as_coroutine(factory))
        except BaseException as exc:  # handed back to the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=target, name="pg-admin")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


async def _as_coroutine(factory: Callable[[], Awaitable[_T]]) -> _T:
    return await factory()


class PostgresServer:
    """One throwaway cluster: ``initdb`` once, then `start` / `stop` as often as a test needs.

    Args:
        fast: turn off fsync and friends (tests); False keeps PostgreSQL's durable defaults (benchmarks).
    """

    user = "agentlife"

    def __init__(self, *, fast: bool = True) -> None:
        missing = [name for name in _BINARIES if shutil.which(name) is None]
        if missing:
            raise PostgresUnavailable(
                f"PostgreSQL server binaries not found on PATH: {', '.join(missing)} "
                "(install the server, e.g. Debian's postgresql package, and put its bin directory on PATH)"
            )
        self.fast = fast
        self.password = "pw-" + secrets.token_hex(12)
        self.port = 0
        self.root = Path(tempfile.mkdtemp(prefix="agentlife-pg-"))
        self.data_dir = self.root / "data"
        self.log_file = self.root / "server.log"
        self._as_root = os.geteuid() == 0
        self._running = False
        self._names = itertools.count()
        self._shared_database = ""

    # -- process control -------------------------------------------------------------------------------

    def _command(self, *args: str) -> list[str]:
        # PostgreSQL refuses to run as root: drop to the postgres system user for every server binary.
        return ["runuser", "-u", "postgres", "--", *args] if self._as_root else list(args)

    def _run(self, *args: str, timeout: float = 60.0) -> None:
        result = subprocess.run(
            self._command(*args),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            log = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            raise PostgresUnavailable(
                f"{args[0]} failed with exit code {result.returncode}: {result.stderr.strip()[-2000:]}\n{log}"
            )

    def init(self) -> None:
        """Create the cluster (``initdb``) with the password-authenticated superuser."""
        if self._as_root:
            import pwd

            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        password_file = self.root / "pwfile"
        password_file.write_text(self.password + "\n")
        if self._as_root:
            os.chown(password_file, entry.pw_uid, entry.pw_gid)
        password_file.chmod(0o600)
        self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            self.user,
            f"--pwfile={password_file}",
            "--auth=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
            "--no-sync",  # only initdb's own final fsync: a throwaway cluster never needs it
        )
        password_file.unlink()
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.root}'",
            **(
                {k: f"'{v}'" for k, v in _FAST_SETTINGS.items()} if self.fast else {"max_connections": "'60'"}
            ),
        }
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    def start(self) -> None:
        """Start the server (again): the first time on a free port, later on the same port."""
        if self._running:
            return
        tries = 1 if self.port else 3
        for attempt in range(tries):
            port = self.port or _free_port()
            try:
                self._run(
                    "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-o", f"-p {port}",
                    "-w", "-t", "60", "start",
                )  # fmt: skip
            except PostgresUnavailable:
                # Another process may have taken the port between our probe and the bind.
                if attempt == tries - 1:
                    raise
                continue
            self.port = port
            self._running = True
            return

    def stop(self) -> None:
        """Stop the server (fast mode: open sessions are disconnected at once)."""
        if not self._running:
            return
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", "stop")
        self._running = False

    @contextlib.contextmanager
    def stopped(self) -> Iterator[None]:
        """Stop the server for the duration of the block and start it again afterwards."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    @property
    def running(self) -> bool:
        """Whether the server was started and not stopped since."""
        return self._running

    def remove(self) -> None:
        """Stop the server and delete its directory."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- databases ------------------------------------------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        """A ``postgresql://`` URL with the password, for ``database``."""
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, prefix: str = "t") -> str:
        """Create a fresh, empty database and return its URL (about 0.1-0.3 s: prefer `create_schema`)."""
        name = self._unique(prefix)
        self.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def create_schema(self, prefix: str = "t") -> str:
        """A fresh, empty schema in the shared test database; the URL makes it the connection's search_path.

        Unqualified table names then resolve to (and are created in) that schema alone, so tests sharing the
        server never see each other's rows, at a fraction of the cost of ``CREATE DATABASE``.
        """
        if not self._shared_database:
            self._shared_database = self._unique("shared")
            self.execute(f"CREATE DATABASE {self._shared_database}")
        name = self._unique(prefix)
        self.execute(f"CREATE SCHEMA {name}", database=self._shared_database)
        return f"{self.url(self._shared_database)}?search_path={name}"

    def execute(self, sql: str, *, database: str = "postgres") -> None:
        """Run one administrative statement as the superuser (from a private thread and event loop)."""

        async def run() -> None:
            import asyncpg

            conn = await asyncpg.connect(self.url(database))
            try:
                await conn.execute(sql)
            finally:
                await conn.close()

        _run_async(run)

    def _unique(self, prefix: str) -> str:
        return f"{prefix}_{next(self._names)}_{secrets.token_hex(3)}"


@contextlib.contextmanager
def running_postgres(*, fast: bool = True) -> Iterator[PostgresServer]:
    """A started `PostgresServer`, stopped and deleted when the block ends."""
    server = PostgresServer(fast=fast)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.remove()


try:
    import pytest
except ImportError:  # benchmarks may run without pytest installed
    pass
else:

    @pytest.fixture(scope="session")
    def postgres_server() -> Iterator[PostgresServer]:
        """A real PostgreSQL server for the whole test session (fails, never skips, without binaries)."""
        try:
            context = running_postgres()
            server = context.__enter__()
        except PostgresUnavailable as exc:
            pytest.fail(str(exc), pytrace=False)
        try:
            yield server
        finally:
            context.__exit__(None, None, None)

    @pytest.fixture
    def postgres_url(postgres_server: PostgresServer) -> str:
        """A URL whose tables live in a fresh, empty schema; restarts the server if a test left it down."""
        postgres_server.start()
        return postgres_server.create_schema()
