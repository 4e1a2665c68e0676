"""The client behind ``AgentProcess.make_llm()`` by default, chosen by ``AGENTLIFE_LLM_PROVIDER``.

``anthropic`` (the default): with ``ANTHROPIC_API_KEY`` set it is `AnthropicLLM` (which honours
``ANTHROPIC_BASE_URL``). Without it the agent still boots, hydrates and runs its tools; only the first LLM
call fails, with an `LLMConfigurationError` that says what to set.

``openai``: `OpenAICompatibleLLM` on ``OPENAI_BASE_URL`` (default ``https://api.openai.com/v1``) with
``OPENAI_API_KEY``, which a local server (vLLM, Ollama) may do without.

No path imports a provider's SDK or httpx here: the adapters import them (off the event loop) at their
first call.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from agentlife._config import llm_provider_from_env
from agentlife._exceptions import LLMConfigurationError
from agentlife._llm._protocol import LLMClient, LLMReply, StreamTimeouts

__all__ = ["UnconfiguredLLM", "default_llm"]

NO_API_KEY_MESSAGE = (
    "ANTHROPIC_API_KEY is not set: export it (plus ANTHROPIC_BASE_URL for a proxy or a fake server), "
    "or override AgentProcess.make_llm() to return another client, such as a ScriptedLLM"
)


def default_llm(env: Mapping[str, str] | None = None) -> LLMClient:
    """The default LLM client for ``env`` (default `os.environ`).

    Returns:
        With ``AGENTLIFE_LLM_PROVIDER=openai``, `OpenAICompatibleLLM` (``OPENAI_BASE_URL``,
        ``OPENAI_API_KEY``). Otherwise `AnthropicLLM` when ``ANTHROPIC_API_KEY`` is set, else an
        `UnconfiguredLLM` whose every call raises `LLMConfigurationError` naming the variable.

    Raises:
        ConfigError: ``AGENTLIFE_LLM_PROVIDER`` names no provider (the process refuses it at boot already).
    """
    env = os.environ if env is None else env
    if llm_provider_from_env(env) == "openai":
        from agentlife._llm._openai import OpenAICompatibleLLM

        return OpenAICompatibleLLM(env=env)
    if env.get("ANTHROPIC_API_KEY"):
        from agentlife._llm._anthropic import AnthropicLLM

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
