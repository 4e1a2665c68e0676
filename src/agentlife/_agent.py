"""What agent authors write against: `AgentProcess`, `Done`, `Job`, `Footprint`, `BudgetView`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from agentlife._exitcode import ExitCode
from agentlife._replay import check_replayable

if TYPE_CHECKING:
    from agentlife._llm._protocol import LLMClient
    from agentlife._memory import Embedder
    from agentlife._step._context import StepContext

__all__ = ["AgentProcess", "BudgetView", "Done", "Footprint", "Job"]


@dataclass(frozen=True, slots=True)
class Done:
    """Returned by `AgentProcess.step` to end the job."""

    result: Any = None
    """JSON-serialisable; stored on the job row and handed to ``deliver`` and ``housekeeping``."""
    status: Literal["COMPLETED", "FAILED"] = "COMPLETED"
    """``"COMPLETED"`` or ``"FAILED"``; anything else raises `ValueError`."""
    reason: str | None = None
    """Why, for a FAILED job (kept on the job row)."""

    def __post_init__(self) -> None:
        if self.status not in ("COMPLETED", "FAILED"):
            raise ValueError(f"Done.status must be 'COMPLETED' or 'FAILED', got {self.status!r}")
        check_replayable(self.result, "Done.result")


@dataclass(frozen=True, slots=True)
class Job:
    """The job this process runs, as read from its row at hydration."""

    id: str
    """The job id (``AGENTLIFE_JOB_ID``, ``--job-id``): the row's key and the session directory's name."""
    agent_id: str
    """The agent the job belongs to (`AgentProcess.agent_id`, or ``AGENTLIFE_AGENT_ID``)."""
    attempt: int
    """This process's attempt, from 1: it fences out every earlier attempt's writes."""
    payload: Any = None
    """The job's input, as the control plane or ``job create --payload`` stored it (JSON)."""
    status: str = "RUNNING"
    """The row's status when this process claimed it (a `JobStatus` value)."""


@dataclass(frozen=True, slots=True)
class Footprint:
    """Resource settings; reduced after the previous attempt was OOM-killed (exit 137)."""

    max_context_tokens: int = 200_000
    """The context size the agent should keep its prompts under (50 000 when reduced)."""
    browser_enabled: bool = True
    """Whether heavy tools such as a headless browser may run (off when reduced)."""
    max_concurrent_tools: int = 8
    """How many tool calls of one step run at once (`StepContext.run_tool_calls`); 1 when reduced."""
    reduced: bool = False
    """True when the previous attempt was OOM-killed (exit 137) and this footprint is the smaller one."""

    @classmethod
    def after_exit(cls, previous_exit_code: int | None) -> Footprint:
        """The full footprint, or the reduced one when the previous attempt died of OOM/SIGKILL (137)."""
        if previous_exit_code == ExitCode.OOM_KILLED:
            return cls(max_context_tokens=50_000, browser_enabled=False, max_concurrent_tools=1, reduced=True)
        return cls()


@dataclass(frozen=True, slots=True)
class BudgetView:
    """What is left of the job's budgets when the step looked."""

    input_tokens_remaining: int
    """Input tokens the job may still spend: its limit (the row's ``token_budget``, else
    ``AGENTLIFE_BUDGET_MAX_INPUT_TOKENS``) minus those used."""
    cost_usd_remaining: float
    """US dollars the job may still spend: its limit (the row's ``token_budget``, else
    ``AGENTLIFE_BUDGET_MAX_COST_USD``) minus those spent."""
    run_seconds_remaining: float | None
    """Seconds left of ``AGENTLIFE_RUN_MAX_SECONDS``, counted from this process's start; None: no limit."""
    input_tokens_used: int = 0
    """Input tokens spent so far, over every attempt of the job (the row's ``tokens_consumed``)."""
    cost_usd_used: float = 0.0
    """US dollars spent so far, over every attempt of the job."""


class AgentProcess:
    """Base class of an agent: subclass it and implement `step`.

    Example:
        >>> class Counter(AgentProcess):
        ...     agent_id = "counter"
        ...     async def step(self, ctx):
        ...         ctx.state["n"] = ctx.state.get("n", 0) + 1
        ...         return Done(result=ctx.state["n"]) if ctx.state["n"] == 3 else None
    """

    #: The agent's id; ``AGENTLIFE_AGENT_ID`` overrides it.
    agent_id: ClassVar[str] = ""
    #: Channel name used in the delivery registry key ``delivery:{job_id}:{channel}``.
    delivery_channel: ClassVar[str] = "default"
    #: What a resumed step does when it issues a different call than the journal recorded at the same
    #: call number: ``"fail"`` raises `ReplayMismatch` (a crash record, exit 1); ``"rerun"`` voids the
    #: step's records from that call on and runs the rest of the step afresh (a side-effecting tool
    #: with ``verify`` is still asked first).
    replay_mismatch: ClassVar[Literal["fail", "rerun"]] = "fail"
    #: MCP servers (`MCPServer`) the runtime starts during hydration, for steps that offer or call their
    #: tools (``ToolAgent.tools`` may list servers directly; both lists are started).
    mcp_servers: ClassVar[Sequence[Any]] = ()

    async def step(self, ctx: StepContext) -> Done | None:
        """One step of the job loop; return `Done` to finish, None to be called again."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    async def deliver(self, result: Any) -> None:
        """Human-facing output after the final step; runs before housekeeping, at most once per channel."""

    async def housekeeping(self, result: Any) -> None:
        """Archival work after delivery: interruptible, and its errors never mask a delivery."""

    def memory_query(self, job: Job, checkpoint: Mapping[str, Any] | None) -> str | None:
        """Text for the hydration memory fetch; None skips it. Default: payload + checkpoint summary."""
        parts = [str(job.payload)] if job.payload not in (None, "", {}) else []
        if checkpoint:
            summary = checkpoint.get("summary")
            if summary:
                parts.append(str(summary))
        return " ".join(parts) or None

    def memories_to_store(self, result: Any, state: Mapping[str, Any]) -> list[str]:
        """Texts to write to long-term memory when the job completes (default: none)."""
        return []

    async def check_policy(self, tool_name: str, args: Mapping[str, Any]) -> bool:
        """Whether a ``restricted=True`` tool may run with ``args`` (default: allow)."""
        return True

    def make_llm(self) -> LLMClient:
        """The LLM client behind ``ctx.llm``: Anthropic when ``ANTHROPIC_API_KEY`` is set.

        ``AGENTLIFE_LLM_PROVIDER=openai`` picks `OpenAICompatibleLLM` instead (``OPENAI_BASE_URL``,
        ``OPENAI_API_KEY``). Without a key the returned client raises a clear `LLMConfigurationError` at
        its first call.
        """
        from agentlife._llm._default import default_llm

        return default_llm()

    def make_embedder(self) -> Embedder:
        """The `Embedder` used for memory (default: the deterministic offline hashing embedder)."""
        from agentlife._memory import HashingEmbedder

        return HashingEmbedder()

    @classmethod
    def main(cls, argv: list[str] | None = None) -> None:
        """Run this agent as the process's main program (``if __name__ == "__main__": MyAgent.main()``)."""
        from agentlife._cli import exit_now, run_agent_main

        exit_now(run_agent_main(cls, argv))
