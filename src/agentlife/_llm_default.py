"""The client behind ``AgentProcess.make_llm()`` by default.

With ``ANTHROPIC_API_KEY`` set it is `AnthropicLLM` (which honours ``ANTHROPIC_BASE_URL``). Without it
the agent still boots, hydrates and runs its tools; only the first LLM call fails, with an
`LLMConfigurationError` that says what to set. Neither path imports ``anthropic`` here: the adapter
imports it (off the event loop) at its first call.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from agentlife._exceptions import LLMConfigurationError
from agentlife._llm import LLMClient, LLMReply, StreamTimeouts

__all__ = ["UnconfiguredLLM", "default_llm"]

NO_API_KEY_MESSAGE = (
    "ANTHROPIC_API_KEY is not set: export it (plus ANTHROPIC_BASE_URL for a proxy or a fake server), "
    "or override AgentProcess.make_llm() to return another client, such as a ScriptedLLM"
)


def default_llm(env: Mapping[str, str] | None = None) -> LLMClient:
    """The default LLM client for ``env`` (default `os.environ`).

    Returns:
        `AnthropicLLM` when ``ANTHROPIC_API_KEY`` is set, else an `UnconfiguredLLM` whose every call
        raises `LLMConfigurationError` naming the variable.
    """
    env = os.environ if env is None else env
    if env.get("ANTHROPIC_API_KEY"):
        from agentlife._anthropic import AnthropicLLM

        return AnthropicLLM(env=env)
    return UnconfiguredLLM(NO_API_KEY_MESSAGE)


class UnconfiguredLLM:
    """An `LLMClient` that cannot call anything: ``complete`` raises `LLMConfigurationError`.

    Configuration errors are never retried, so the step fails at once with the reason.
    """

    def __init__(self, reason: str = NO_API_KEY_MESSAGE) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return "UnconfiguredLLM()"

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        timeouts: StreamTimeouts | None = None,
        **params: Any,
    ) -> LLMReply:
        """Raise `LLMConfigurationError` with the reason."""
        raise LLMConfigurationError(self.reason)

    async def aclose(self) -> None:
        """Nothing to release."""
