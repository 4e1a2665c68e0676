"""The probe server, over real HTTP on 127.0.0.1, driven through the health decision matrix."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from agentlife._observe._probes import ProbeServer
from agentlife._observe._status import StatusBoard
from agentlife._redact import Redactor

SECRET = "sk-ant-api03-verysecretvalue123456"


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]


@dataclass
class Probe:
    board: StatusBoard
    server: ProbeServer
    client: httpx.Client
    log: ListHandler
    port: int


def plain_client(port: int, timeout: float = 5.0) -> httpx.Client:
    # Plain HTTP on loopback: verify=False only spares loading the CA bundle for every client (~80 ms).
    return httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout, verify=False)


def make_logger() -> tuple[logging.Logger, ListHandler]:
    # A private logger: no global logging state is touched, and the records are ours alone.
    logger = logging.Logger("test.probes", logging.DEBUG)
    handler = ListHandler()
    logger.addHandler(handler)
    return logger, handler


@pytest.fixture
def probe() -> Iterator[Probe]:
    board = StatusBoard(job_id="job-42", agent_id="reviewer", attempt=3, pod_name="pod-a")
    logger, handler = make_logger()
    server = ProbeServer(
        board, "127.0.0.1", 0, blocked_threshold=5.0, logger=logger, redactor=Redactor([SECRET])
    )
    server.start()
    port = server.wait_started(timeout=20)
    assert port is not None
    with plain_client(port) as client:
        yield Probe(board, server, client, handler, port)
    server.stop()
    assert not server.is_running


# -- start, stop, bind ------------------------------------------------------------------------------


def test_import_is_light_and_start_does_not_wait_for_the_server() -> None:
    # The probe server speaks HTTP itself: aiohttp (hundreds of ms of import) is never loaded, before or
    # after it serves. A ratio of start() to ready timings used to stand for this; on a loaded machine a
    # thread's start cost half of the (now light) server's, and proved nothing either way.
    script = textwrap.dedent(
        """
        import sys
        from agentlife._observe._probes import ProbeServer
        from agentlife._observe._lag import run_lag_monitor
        from agentlife._observe._status import StatusBoard
        assert "aiohttp" not in sys.modules, "aiohttp imported at module level"
        board = StatusBoard(job_id="j", agent_id="a", attempt=1)
        server = ProbeServer(board, "127.0.0.1", 0, blocked_threshold=5.0)
        server.start()
        bound_before_return = server.port is not None
        port = server.wait_started(60)
        server.stop()
        print("aiohttp" in sys.modules, bound_before_return, port is not None)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=90, check=True
    )
    aiohttp_loaded, bound_before_return, bound = out.stdout.split()
    assert bound == "True"
    assert bound_before_return == "False"  # start() only spawned the server's thread
    assert aiohttp_loaded == "False"


# -- the blocked loop ---------------------------------------------------------------------------------


THRESHOLD, INTERVAL, BLOCK = 0.3, 0.05, 1.5
