"""SSE heartbeat against a real aiohttp control-plane stub, the heartbeat monitor, and the job heartbeat."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from agentlife.testing._control_plane import (
    ControlPlaneStub,
    HeartbeatMonitor,
)

pytestmark = pytest.mark.anyio

TOKEN = "cp-token-Zq8x3Lw91"
INTERVAL = 0.1


@pytest.fixture
async def plane() -> AsyncIterator[ControlPlaneStub]:
    async with ControlPlaneStub(token=TOKEN, monitor=HeartbeatMonitor(INTERVAL, 3 * INTERVAL)) as stub:
        yield stub


# -- pure pieces --------------------------------------------------------------------------------------


def test_modules_import_without_heavy_clients() -> None:
    code = (
        "import sys, agentlife._observe._heartbeat, agentlife._observe._telemetry\n"
        "import agentlife.testing._control_plane\n"
        "heavy = [m for m in ('httpx', 'aiohttp', 'opentelemetry') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
