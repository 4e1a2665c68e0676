"""agentlife: the lifecycle of one AI-agent job inside one Kubernetes pod.

Subclass `AgentProcess`, implement ``step``, and run it with ``python -m agentlife run module:Class``.
Only the core is imported here; heavy clients (anthropic, qdrant-client, asyncpg, aiohttp, httpx) load
when a feature first needs them, on a background thread during boot.
"""

from __future__ import annotations

from agentlife._agent import AgentProcess, BudgetView, Done, Footprint, Job
from agentlife._exceptions import (
    AgentlifeError,
    AttemptFenced,
    BackgroundOperationRestricted,
    BudgetExhausted,
    CallError,
    CheckpointCorrupt,
    ConfigError,
    InvalidTransition,
    InvariantViolation,
    JobNotFound,
    LLMConfigurationError,
    LLMTimeout,
    PermanentError,
    PolicyUnavailable,
    ScheduleError,
    StoreError,
    StoreUnavailable,
    ToolTimeout,
    TransientError,
)
from agentlife._llm import LLMClient, LLMReply, StreamTimeouts, Usage
from agentlife._state import State
from agentlife._tools import NOT_DONE, ToolSpec, tool

__version__ = "0.1.0"

__all__ = [
    "NOT_DONE",
    "AgentProcess",
    "AgentlifeError",
    "AttemptFenced",
    "BackgroundOperationRestricted",
    "BudgetExhausted",
    "BudgetView",
    "CallError",
    "CheckpointCorrupt",
    "ConfigError",
    "Done",
    "Footprint",
    "InvalidTransition",
    "InvariantViolation",
    "Job",
    "JobNotFound",
    "LLMClient",
    "LLMConfigurationError",
    "LLMReply",
    "LLMTimeout",
    "PermanentError",
    "PolicyUnavailable",
    "ScheduleError",
    "State",
    "StoreError",
    "StoreUnavailable",
    "StreamTimeouts",
    "ToolSpec",
    "ToolTimeout",
    "TransientError",
    "Usage",
    "__version__",
    "tool",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("agentlife._"):
        _obj.__module__ = "agentlife"
del _name, _obj
