"""The pytest plugin (entry point ``pytest11: agentlife``): the ``agent_harness`` fixture.

It imports the runtime only when a test asks for the fixture, so loading the plugin costs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from agentlife.testing._harness import AgentHarness


@pytest.fixture
def agent_harness(tmp_path: Path) -> AgentHarness:
    """An `AgentHarness` on a fresh temporary data dir, time scaled by 0.01 (45 s deadline = 0.45 s)."""
    from agentlife.testing._harness import AgentHarness

    return AgentHarness(tmp_path / "agentlife")
