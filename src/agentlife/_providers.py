"""The model providers ``AGENTLIFE_LLM_PROVIDER`` can name: one row each, read by every part that differs.

A row says where the provider's adapter lives (loaded only when chosen), which variable must be set before
a call can succeed, which modules to import off the event loop while the process boots, and the name its
calls carry in telemetry (``gen_ai.provider.name``). Adding a provider is its adapter module, one row
here, and a fake server for its tests.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_PROVIDER", "PROVIDERS", "Provider"]


@dataclass(frozen=True, slots=True)
class Provider:
    """One model provider the default client can be."""

    name: str
    """The value of ``AGENTLIFE_LLM_PROVIDER`` that chooses it, and its ``gen_ai.provider.name``."""
    adapter: str
    """``module:Class`` of its `LLMClient`, built as ``Class(env=env)`` when the provider is chosen."""
    key_variable: str | None
    """The variable without which no call can succeed (None: a local server may need none)."""
    preload: tuple[str, ...] = ()
    """Modules imported on a thread while the process boots, when the key is set."""
    hint: str = ""
    """What else to set, for the error that names a missing key."""


PROVIDERS: dict[str, Provider] = {
    row.name: row
    for row in (
        Provider(
            "anthropic",
            "agentlife._llm._anthropic:AnthropicLLM",
            key_variable="ANTHROPIC_API_KEY",
            hint="plus ANTHROPIC_BASE_URL for a proxy or a fake server",
        ),
        Provider("openai", "agentlife._llm._openai:OpenAICompatibleLLM", key_variable=None),
    )
}
DEFAULT_PROVIDER = "anthropic"
