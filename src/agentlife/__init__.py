"""agentlife: the lifecycle of one AI-agent job inside one Kubernetes pod.

Subclass `AgentProcess`, implement ``step``, and run it with ``python -m agentlife run module:Class``.
Only the core is imported here; heavy clients (anthropic, qdrant-client, asyncpg, aiohttp, httpx) load
when a feature first needs them, on a background thread during boot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentlife import _exports
from agentlife._agent import AgentProcess as AgentProcess
from agentlife._agent import BudgetView as BudgetView
from agentlife._agent import Done as Done
from agentlife._agent import Footprint as Footprint
from agentlife._agent import Job as Job
from agentlife._exceptions import AgentlifeError as AgentlifeError
from agentlife._exceptions import ApprovalRejected as ApprovalRejected
from agentlife._exceptions import AttemptFenced as AttemptFenced
from agentlife._exceptions import BackgroundOperationRestricted as BackgroundOperationRestricted
from agentlife._exceptions import BudgetExhausted as BudgetExhausted
from agentlife._exceptions import CallError as CallError
from agentlife._exceptions import CheckpointCorrupt as CheckpointCorrupt
from agentlife._exceptions import ChildJobError as ChildJobError
from agentlife._exceptions import ConfigError as ConfigError
from agentlife._exceptions import InvalidTransition as InvalidTransition
from agentlife._exceptions import InvariantViolation as InvariantViolation
from agentlife._exceptions import JobCancelled as JobCancelled
from agentlife._exceptions import JobDeadLettered as JobDeadLettered
from agentlife._exceptions import JobFailed as JobFailed
from agentlife._exceptions import JobNotFound as JobNotFound
from agentlife._exceptions import JobStateConflict as JobStateConflict
from agentlife._exceptions import LLMConfigurationError as LLMConfigurationError
from agentlife._exceptions import LLMTimeout as LLMTimeout
from agentlife._exceptions import MCPServerUnavailable as MCPServerUnavailable
from agentlife._exceptions import MCPToolError as MCPToolError
from agentlife._exceptions import MemoryUnavailable as MemoryUnavailable
from agentlife._exceptions import OutputValidationError as OutputValidationError
from agentlife._exceptions import PermanentError as PermanentError
from agentlife._exceptions import PolicyUnavailable as PolicyUnavailable
from agentlife._exceptions import ReplayMismatch as ReplayMismatch
from agentlife._exceptions import ResultTimeout as ResultTimeout
from agentlife._exceptions import ScheduleError as ScheduleError
from agentlife._exceptions import StoreError as StoreError
from agentlife._exceptions import StoreUnavailable as StoreUnavailable
from agentlife._exceptions import ToolArgumentsInvalid as ToolArgumentsInvalid
from agentlife._exceptions import ToolTimeout as ToolTimeout
from agentlife._exceptions import TransientError as TransientError
from agentlife._exceptions import UnreplayableValue as UnreplayableValue
from agentlife._jobrefs import JobHandle as JobHandle
from agentlife._jobrefs import JobOutcome as JobOutcome
from agentlife._llm._protocol import LLMClient as LLMClient
from agentlife._llm._protocol import LLMReply as LLMReply
from agentlife._llm._protocol import StreamEvent as StreamEvent
from agentlife._llm._protocol import StreamTimeouts as StreamTimeouts
from agentlife._llm._protocol import Usage as Usage
from agentlife._state import State as State
from agentlife._tools import NOT_DONE as NOT_DONE
from agentlife._tools import ToolSpec as ToolSpec
from agentlife._tools import tool as tool
from agentlife._version import __version__ as __version__

if TYPE_CHECKING:
    from agentlife._client._blocking import BlockingClient as BlockingClient
    from agentlife._client._client import Client as Client
    from agentlife._client._views import JobPage as JobPage
    from agentlife._client._views import JobSnapshot as JobSnapshot
    from agentlife._client._views import JobSummary as JobSummary
    from agentlife._journal._conversation import Conversation as Conversation
    from agentlife._llm._anthropic import AnthropicLLM as AnthropicLLM
    from agentlife._llm._openai import OpenAICompatibleLLM as OpenAICompatibleLLM
    from agentlife._llm._pricing import PriceTable as PriceTable
    from agentlife._llm._scripted import ScriptedLLM as ScriptedLLM
    from agentlife._llm._scripted import ScriptedTurn as ScriptedTurn
    from agentlife._mcp._server import MCPServer as MCPServer
    from agentlife._memory import Embedder as Embedder
    from agentlife._memory import HashingEmbedder as HashingEmbedder
    from agentlife._memory import MemoryRecord as MemoryRecord
    from agentlife._output._events import JobEvent as JobEvent
    from agentlife._output._follow import JobFollower as JobFollower
    from agentlife._schedule import Schedule as Schedule
    from agentlife._step._context import StepContext as StepContext
    from agentlife._step._stepllm import StepLLM as StepLLM
    from agentlife._step._streaming import LLMStream as LLMStream
    from agentlife._step._structured import StructuredReply as StructuredReply
    from agentlife._step._tool_agent import ToolAgent as ToolAgent
    from agentlife.stores._delivery import DeliveryGuard as DeliveryGuard
    from agentlife.stores._policy import CircuitBreaker as CircuitBreaker
    from agentlife.stores._policy import RetryDecision as RetryDecision
    from agentlife.stores._policy import crash_backoff_schedule as crash_backoff_schedule
    from agentlife.stores._policy import derive_total_timeout as derive_total_timeout
    from agentlife.stores._policy import should_retry_after_crash as should_retry_after_crash

_EXPORTS = _exports.Exports(__name__, publish_as=__name__)

for _name, _value in list(globals().items()):
    if not _name.startswith("_"):
        _exports.publish(_value, __name__)
del _name, _value


def __getattr__(name: str) -> Any:
    # A lazy public name (or __all__): read from the import block above, loaded once, then a plain global.
    value = _EXPORTS.load(name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return _EXPORTS.names()
