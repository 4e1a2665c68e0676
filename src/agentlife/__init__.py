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
    ChildJobError,
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
from agentlife._jobrefs import JobHandle, JobOutcome
from agentlife._llm._protocol import LLMClient, LLMReply, StreamEvent, StreamTimeouts, Usage
from agentlife._state import State
from agentlife._tools import NOT_DONE, ToolSpec, tool
from agentlife._version import __version__

if TYPE_CHECKING:
    from agentlife._journal._conversation import Conversation
    from agentlife._llm._anthropic import AnthropicLLM
    from agentlife._llm._openai import OpenAICompatibleLLM
    from agentlife._llm._pricing import PriceTable
    from agentlife._llm._scripted import ScriptedLLM, ScriptedTurn
    from agentlife._mcp._server import MCPServer
    from agentlife._memory import Embedder, HashingEmbedder, MemoryRecord
    from agentlife._schedule import Schedule
    from agentlife._step._context import StepContext
    from agentlife._step._stepllm import StepLLM
    from agentlife._step._streaming import LLMStream
    from agentlife._step._structured import StructuredReply
    from agentlife._step._tool_agent import ToolAgent
    from agentlife.stores._delivery import DeliveryGuard
    from agentlife.stores._policy import (
        CircuitBreaker,
        RetryDecision,
        crash_backoff_schedule,
        derive_total_timeout,
        should_retry_after_crash,
    )

# Public names whose modules pull in more than the core (anyio, the journal, cron and pricing tables):
# they load on first access, so `import agentlife` stays as cheap as `import asyncio`.
_LAZY = {
    "AnthropicLLM": "agentlife._llm._anthropic",
    "CircuitBreaker": "agentlife.stores._policy",
    "Conversation": "agentlife._journal._conversation",
    "DeliveryGuard": "agentlife.stores._delivery",
    "Embedder": "agentlife._memory",
    "HashingEmbedder": "agentlife._memory",
    "LLMStream": "agentlife._step._streaming",
    "MCPServer": "agentlife._mcp._server",
    "MemoryRecord": "agentlife._memory",
    "OpenAICompatibleLLM": "agentlife._llm._openai",
    "PriceTable": "agentlife._llm._pricing",
    "RetryDecision": "agentlife.stores._policy",
    "Schedule": "agentlife._schedule",
    "ScriptedLLM": "agentlife._llm._scripted",
    "ScriptedTurn": "agentlife._llm._scripted",
    "StepContext": "agentlife._step._context",
    "StepLLM": "agentlife._step._stepllm",
    "StructuredReply": "agentlife._step._structured",
    "ToolAgent": "agentlife._step._tool_agent",
    "crash_backoff_schedule": "agentlife.stores._policy",
    "derive_total_timeout": "agentlife.stores._policy",
    "should_retry_after_crash": "agentlife.stores._policy",
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
    "ChildJobError",
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
    "JobHandle",
    "JobNotFound",
    "JobOutcome",
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
    module = getattr(obj, "__module__", "")
    if module.startswith("agentlife.") and any(part.startswith("_") for part in module.split(".")):
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
