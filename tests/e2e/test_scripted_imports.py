"""ScriptedLLM: scripted streams replayed through the real guard and assembler; the default client."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.anyio


def test_nothing_heavy_is_imported_until_a_call_needs_it() -> None:
    code = (
        "import sys, agentlife, agentlife.testing\n"
        "from agentlife._llm._default import default_llm\n"
        "from agentlife._llm._scripted import ScriptedLLM, ScriptedTurn\n"
        "from agentlife.testing._anthropic_server import FakeAnthropicServer\n"
        "default_llm({})\n"
        "default_llm({'ANTHROPIC_API_KEY': 'sk-ant-xyz123456'})\n"
        "FakeAnthropicServer([ScriptedTurn.text('hi')])\n"
        "heavy = sorted(m for m in ('anthropic', 'aiohttp', 'httpx', 'httpx2') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == ""
