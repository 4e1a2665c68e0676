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

from typing import TYPE_CHECKING, Any

from agentlife import _exports

if TYPE_CHECKING:
    from agentlife._llm._scripted import ScriptedLLM as ScriptedLLM
    from agentlife._llm._scripted import ScriptedTurn as ScriptedTurn
    from agentlife.testing._anthropic_server import FakeAnthropicServer as FakeAnthropicServer
    from agentlife.testing._control_plane import ControlPlaneStub as ControlPlaneStub
    from agentlife.testing._control_plane import HeartbeatMonitor as HeartbeatMonitor
    from agentlife.testing._control_plane import HeartbeatStatus as HeartbeatStatus
    from agentlife.testing._control_plane import ReceivedEvent as ReceivedEvent
    from agentlife.testing._fake_server import FakeRequest as FakeRequest
    from agentlife.testing._fake_server import ProviderLimits as ProviderLimits
    from agentlife.testing._harness import AgentHarness as AgentHarness
    from agentlife.testing._harness import AgentRun as AgentRun
    from agentlife.testing._harness import DrainAt as DrainAt
    from agentlife.testing._openai_server import FakeOpenAIServer as FakeOpenAIServer

_EXPORTS = _exports.Exports(__name__)


def __getattr__(name: str) -> Any:
    # Every public name here is lazy: read from the import block above, loaded once, then a plain global.
    value = _EXPORTS.load(name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return _EXPORTS.names()
