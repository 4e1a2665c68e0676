"""The pytest plugin: its ``pytest11`` entry point and the ``agent_harness`` fixture, tested with pytester.

The generated test files run in a fresh pytest session (in this process, through ``pytester.runpytest``)
whose directory has no conftest providing ``agent_harness``: the fixture can only come from the plugin the
entry point registers.
"""

from __future__ import annotations

import subprocess
import sys

pytest_plugins = ["pytester"]


def test_loading_the_plugin_imports_nothing_of_the_runtime() -> None:
    # pytest loads every installed plugin in every session, so the plugin must cost nothing until used.
    code = (
        "import sys, agentlife.testing._plugin\n"
        "heavy = [m for m in ('agentlife._runtime', 'agentlife.testing._harness', 'anyio', 'aiohttp')"
        " if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
