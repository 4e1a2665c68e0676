"""agentlife: the lifecycle of one AI-agent job inside one Kubernetes pod.

Subclass `AgentProcess`, implement ``step``, and run it with ``python -m agentlife run module:Class``.
Only the core is imported here; heavy clients (anthropic, qdrant-client, asyncpg, aiohttp, httpx) load
when a feature first needs them, on a background thread during boot.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import TYPE_CHECKING, Any

from agentlife._agent import AgentProcess, BudgetView, Done, Footprint, Job
from agentlife._exceptions import (
    AgentlifeError,
    ApprovalRejected,
    AttemptFenced,
    BackgroundOperationRestricted,
    BudgetExhausted,
    CallError,
    CheckpointCorrupt,
    ConfigError,
    InvalidTransition,
    InvariantViolation,
    JobNotFound,
    JobStateConflict,
    LLMConfigurationError,
    LLMTimeout,
    MCPServerUnavailable,
    MCPToolError,
    MemoryUnavailable,
    OutputValidationError,
    PermanentError,
    PolicyUnavailable,
    ReplayMismatch,
    ScheduleError,
    StoreError,
    StoreUnavailable,
    ToolArgumentsInvalid,
    ToolTimeout,
    TransientError,
    UnreplayableValue,
)
from agentlife._llm import LLMClient, LLMReply, StreamEvent, StreamTimeouts, Usage
from agentlife._state import State
from agentlife._tools import NOT_DONE, ToolSpec, tool
from agentlife._version import __version__

if TYPE_CHECKING:
    from agentlife._anthropic import AnthropicLLM
    from agentlife._conversation import Conversation
    from agentlife._delivery import DeliveryGuard
    from agentlife._mcp import MCPServer
    from agentlife._memory import Embedder, HashingEmbedder, MemoryRecord
    from agentlife._openai import OpenAICompatibleLLM
    from agentlife._policy import (
        CircuitBreaker,
        RetryDecision,
        crash_backoff_schedule,
        derive_total_timeout,
        should_retry_after_crash,
    )
    from agentlife._pricing import PriceTable
    from agentlife._runtime._context import StepContext
    from agentlife._runtime._stepllm import StepLLM
    from agentlife._runtime._streaming import LLMStream
    from agentlife._runtime._structured import StructuredReply
    from agentlife._runtime._tool_agent import ToolAgent
    from agentlife._schedule import Schedule
    from agentlife._scripted import ScriptedLLM, ScriptedTurn

# Public names whose modules pull in more than the core (anyio, the journal, cron and pricing tables):
# they load on first access, so `import agentlife` stays as cheap as `import asyncio`.
_LAZY = {
    "AnthropicLLM": "agentlife._anthropic",
    "CircuitBreaker": "agentlife._policy",
    "Conversation": "agentlife._conversation",
    "DeliveryGuard": "agentlife._delivery",
    "Embedder": "agentlife._memory",
    "HashingEmbedder": "agentlife._memory",
    "LLMStream": "agentlife._runtime._streaming",
    "MCPServer": "agentlife._mcp",
    "MemoryRecord": "agentlife._memory",
    "OpenAICompatibleLLM": "agentlife._openai",
    "PriceTable": "agentlife._pricing",
    "RetryDecision": "agentlife._policy",
    "Schedule": "agentlife._schedule",
    "ScriptedLLM": "agentlife._scripted",
    "ScriptedTurn": "agentlife._scripted",
    "StepContext": "agentlife._runtime._context",
    "StepLLM": "agentlife._runtime._stepllm",
    "StructuredReply": "agentlife._runtime._structured",
    "ToolAgent": "agentlife._runtime._tool_agent",
    "crash_backoff_schedule": "agentlife._policy",
    "derive_total_timeout": "agentlife._policy",
    "should_retry_after_crash": "agentlife._policy",
}


__all__ = [
    "NOT_DONE",
    "AgentProcess",
    "AgentlifeError",
    "AnthropicLLM",
    "ApprovalRejected",
    "AttemptFenced",
    "BackgroundOperationRestricted",
    "BudgetExhausted",
    "BudgetView",
    "CallError",
    "CheckpointCorrupt",
    "CircuitBreaker",
    "ConfigError",
    "Conversation",
    "DeliveryGuard",
    "Done",
    "Embedder",
    "Footprint",
    "HashingEmbedder",
    "InvalidTransition",
    "InvariantViolation",
    "Job",
    "JobNotFound",
    "JobStateConflict",
    "LLMClient",
    "LLMConfigurationError",
    "LLMReply",
    "LLMStream",
    "LLMTimeout",
    "MCPServer",
    "MCPServerUnavailable",
    "MCPToolError",
    "MemoryRecord",
    "MemoryUnavailable",
    "OpenAICompatibleLLM",
    "OutputValidationError",
    "PermanentError",
    "PolicyUnavailable",
    "PriceTable",
    "ReplayMismatch",
    "RetryDecision",
    "Schedule",
    "ScheduleError",
    "ScriptedLLM",
    "ScriptedTurn",
    "State",
    "StepContext",
    "StepLLM",
    "StoreError",
    "StoreUnavailable",
    "StreamEvent",
    "StreamTimeouts",
    "StructuredReply",
    "ToolAgent",
    "ToolArgumentsInvalid",
    "ToolSpec",
    "ToolTimeout",
    "TransientError",
    "UnreplayableValue",
    "Usage",
    "__version__",
    "crash_backoff_schedule",
    "derive_total_timeout",
    "should_retry_after_crash",
    "tool",
]


def _publish(obj: Any) -> Any:
    """Show the public path in tracebacks and docs: ``agentlife.Done``, not ``agentlife._agent.Done``."""
    if getattr(obj, "__module__", "").startswith("agentlife._"):
        with contextlib.suppress(AttributeError, TypeError):  # builtins and some protocols refuse it
            obj.__module__ = "agentlife"
    return obj


for _name in __all__:
    if _name not in _LAZY and _name != "__version__":
        _publish(globals()[_name])
del _name


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentlife' has no attribute {name!r}")
    value = _publish(getattr(importlib.import_module(module), name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
