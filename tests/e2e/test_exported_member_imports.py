"""The public surface: complete, sorted, documented, and cheap to import."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("asyncpg", "qdrant_client", "anthropic", "aiohttp", "httpx", "opentelemetry", "croniter")


def test_import_agentlife_loads_only_the_core() -> None:
    code = (
        "import sys, agentlife\n"
        f"heavy = [m for m in sys.modules if m.split('.')[0] in {HEAVY!r}]\n"
        "print(','.join(sorted(heavy)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_runtime_path_defers_heavy_clients() -> None:
    # Even the whole runtime (what `python -m agentlife run` imports before boot) stays off the heavy clients;
    # they load on the preload thread, the probe thread or the telemetry thread.
    code = (
        "import sys, agentlife._runtime._lifecycle, agentlife._cli, agentlife.testing._harness\n"
        f"heavy = [m for m in sys.modules if m.split('.')[0] in {HEAVY!r}]\n"
        "print(','.join(sorted(heavy)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
