"""The client behind ``AgentProcess.make_llm()`` by default, chosen by ``AGENTLIFE_LLM_PROVIDER``.

The provider's row in `agentlife._providers.PROVIDERS` names its adapter: ``anthropic`` (the default) is
`AnthropicLLM` (which honours ``ANTHROPIC_BASE_URL``), ``openai`` is `OpenAICompatibleLLM` on
``OPENAI_BASE_URL`` (default ``https://api.openai.com/v1``) with ``OPENAI_API_KEY``, which a local server
(vLLM, Ollama) may do without. Without the variable a provider's row requires, the agent still boots,
hydrates and runs its tools; only the first LLM call fails, with an `LLMConfigurationError` that says what
to set.

No path imports a provider's SDK or httpx here: the adapters import them (off the event loop) at their
first call, and the adapter module itself loads only for the provider chosen.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

from agentlife._config import llm_provider_from_env
from agentlife._exceptions import LLMConfigurationError
from agentlife._llm._protocol import LLMClient, LLMReply, StreamTimeouts
from agentlife._providers import DEFAULT_PROVIDER, PROVIDERS, Provider

__all__ = ["UnconfiguredLLM", "default_llm", "missing_key_message"]


def missing_key_message(provider: Provider) -> str:
    """What to do when ``provider``'s key variable is not set."""
    hint = f" ({provider.hint})" if provider.hint else ""
    return (
        f"{provider.key_variable} is not set: export it{hint}, "
        "or override AgentProcess.make_llm() to return another client, such as a ScriptedLLM"
    )


NO_API_KEY_MESSAGE = missing_key_message(PROVIDERS[DEFAULT_PROVIDER])


def default_llm(env: Mapping[str, str] | None = None) -> LLMClient:
    """The default LLM client for ``env`` (default `os.environ`).

    Returns:
        The adapter of the provider ``AGENTLIFE_LLM_PROVIDER`` names (``anthropic`` when unset), built with
        ``env``; an `UnconfiguredLLM` whose every call raises `LLMConfigurationError` naming the variable
        when the provider's key variable is not set.

    Raises:
        ConfigError: ``AGENTLIFE_LLM_PROVIDER`` names no provider (the process refuses it at boot already).
    """
    env = os.environ if env is None else env
    provider = PROVIDERS[llm_provider_from_env(env)]
    if provider.key_variable is not None and not env.get(provider.key_variable):
        return UnconfiguredLLM(missing_key_message(provider))
    module_name, _, class_name = provider.adapter.partition(":")
    adapter = getattr(importlib.import_module(module_name), class_name)
    return cast("LLMClient", adapter(env=env))


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
