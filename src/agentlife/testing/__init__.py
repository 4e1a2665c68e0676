"""Test helpers for agent authors: the in-process harness, the pytest plugin, stub servers.

* `AgentHarness` / `DrainAt`: run an agent in-process on a temporary data dir with scaled time and send a
  simulated SIGTERM at a chosen moment (the ``agent_harness`` pytest fixture builds one).
* `ScriptedLLM` / `ScriptedTurn`: replay recorded LLM streams with chosen delays, stalls and errors.
* `FakeAnthropicServer` / `FakeOpenAIServer`: local servers speaking the Anthropic Messages and the OpenAI
  Chat Completions streaming formats (also runnable: ``python -m agentlife.testing fake-openai --port N``).
* `ControlPlaneStub` / `HeartbeatMonitor`: the receiving side of the SSE heartbeat stream.

Importing this package is cheap: each helper's module (and aiohttp, for the servers) loads on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentlife._llm._scripted import ScriptedLLM, ScriptedTurn
    from agentlife.testing._anthropic_server import FakeAnthropicServer
    from agentlife.testing._control_plane import (
        ControlPlaneStub,
        HeartbeatMonitor,
        HeartbeatStatus,
        ReceivedEvent,
    )
    from agentlife.testing._fake_server import FakeRequest
    from agentlife.testing._harness import AgentHarness, AgentRun, DrainAt
    from agentlife.testing._openai_server import FakeOpenAIServer

__all__ = [
    "AgentHarness",
    "AgentRun",
    "ControlPlaneStub",
    "DrainAt",
    "FakeAnthropicServer",
    "FakeOpenAIServer",
    "FakeRequest",
    "HeartbeatMonitor",
    "HeartbeatStatus",
    "ReceivedEvent",
    "ScriptedLLM",
    "ScriptedTurn",
]

_WHERE = {
    "AgentHarness": "agentlife.testing._harness",
    "AgentRun": "agentlife.testing._harness",
    "DrainAt": "agentlife.testing._harness",
    "ScriptedLLM": "agentlife._llm._scripted",
    "ScriptedTurn": "agentlife._llm._scripted",
    "FakeAnthropicServer": "agentlife.testing._anthropic_server",
    "FakeOpenAIServer": "agentlife.testing._openai_server",
    "FakeRequest": "agentlife.testing._fake_server",
    "ControlPlaneStub": "agentlife.testing._control_plane",
    "HeartbeatMonitor": "agentlife.testing._control_plane",
    "HeartbeatStatus": "agentlife.testing._control_plane",
    "ReceivedEvent": "agentlife.testing._control_plane",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
