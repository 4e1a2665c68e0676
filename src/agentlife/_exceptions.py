"""The exception hierarchy of agentlife.

::

    AgentlifeError
    ├── ConfigError                      bad environment, CLI input or agent definition (exit 2 / 1)
    │   ├── InvariantViolation           constants that break one of their invariants
    │   ├── ScheduleError                a schedule refused by `Schedule`
    │   └── ChildJobError                a child job not this job's (an id taken, a wait on a stranger)
    ├── InvalidTransition                a lifecycle transition outside the allowed table
    ├── StoreError                       the checkpoint store failed
    │   ├── StoreUnavailable             unreachable after retries
    │   ├── CheckpointCorrupt            no checkpoint passes its CRC-32
    │   ├── JobNotFound                  no job row and creating one was not allowed
    │   ├── JobStateConflict             the job's status does not allow the operation (approve, cancel ...)
    │   └── AttemptFenced                the row is no longer this process's to write (zombie protection)
    ├── CallError                        an LLM or tool call failed
    │   ├── TransientError               worth retrying with backoff
    │   │   ├── LLMTimeout               (also TimeoutError) connect / chunk / total
    │   │   ├── ToolTimeout              (also TimeoutError) a tool outlived its timeout
    │   │   ├── MCPServerUnavailable     an MCP server did not start or went away mid-call (restarted once)
    │   │   └── PolicyUnavailable        the policy check timed out or failed: fail closed
    │   ├── PermanentError               retrying cannot help (HTTP 400, a tool's own refusal)
    │   │   ├── OutputValidationError    a structured answer still did not fit its type after retries
    │   │   └── MCPToolError             an MCP tool's error, a malformed or oversized result, a dead server
    │   └── LLMConfigurationError        no API key, 401/403
    ├── MemoryUnavailable                the memory store is unreachable, slow or locked (never fatal)
    ├── JobFailed                        `Client.result`: the job ended FAILED (its last crash record on it)
    │   ├── JobCancelled                 ... because an operator (or the client) cancelled it
    │   └── JobDeadLettered              ... DEAD_LETTER: given up after repeated crashes
    ├── ResultTimeout                    (also TimeoutError) `Client.result` timed out: the job runs on
    ├── BudgetExhausted                  token, cost or run-time budget spent
    ├── BackgroundOperationRestricted    a restricted tool without approval
    │   └── ApprovalRejected             the operator refused the call: the job ends FAILED, whatever follows
    ├── ReplayMismatch                   a resumed step's call differs from the one recorded: crash, exit 1
    ├── ToolArgumentsInvalid             a model's tool arguments do not fit the tool: sent back to the model
    └── UnreplayableValue                (also TypeError) a value the journal could not give back exactly
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

__all__ = [
    "AgentlifeError",
    "ApprovalRejected",
    "AttemptFenced",
    "BackgroundOperationRestricted",
    "BudgetExhausted",
    "CallError",
    "CheckpointCorrupt",
    "ChildJobError",
    "ConfigError",
    "InvalidTransition",
    "InvariantViolation",
    "JobCancelled",
    "JobDeadLettered",
    "JobFailed",
    "JobNotFound",
    "JobStateConflict",
    "LLMConfigurationError",
    "LLMTimeout",
    "MCPServerUnavailable",
    "MCPToolError",
    "MemoryUnavailable",
    "OutputValidationError",
    "PermanentError",
    "PolicyUnavailable",
    "ReplayMismatch",
    "ResultTimeout",
    "ScheduleError",
    "StoreError",
    "StoreUnavailable",
    "ToolArgumentsInvalid",
    "ToolTimeout",
    "TransientError",
    "UnreplayableValue",
]


class AgentlifeError(Exception):
    """Root of every error agentlife raises."""


class ConfigError(AgentlifeError):
    """The environment, the command line or the agent definition is not usable."""


class InvariantViolation(ConfigError):
    """A set of constants breaks an invariant; the message names both sides of the inequality."""


class ScheduleError(ConfigError):
    """A schedule was refused; the message names the limit and the offending value."""


class ChildJobError(ConfigError):
    """A child job this job may not use: the id is another job's, or a wait names a job it did not start.

    ``ctx.start_job(job_id=...)`` with the id of a job that some other job or call created, and
    ``ctx.wait_for_jobs`` on a job that is not a child of the waiting job (or does not exist). The step
    fails at once, before anything is journaled or written.
    """


class InvalidTransition(AgentlifeError):
    """A lifecycle transition that the transition table does not allow."""

    def __init__(self, source: object, target: object) -> None:
        super().__init__(f"invalid lifecycle transition {source} -> {target}")
        self.source = source
        self.target = target


class StoreError(AgentlifeError):
    """The checkpoint store failed."""


class StoreUnavailable(StoreError):
    """The store could not be reached, after retries where they apply."""


class CheckpointCorrupt(StoreError):
    """Neither the job's checkpoint nor any history entry passes its CRC-32."""


class JobNotFound(StoreError):
    """The job row does not exist and this process may not create it."""


class JobStateConflict(StoreError):
    """The job row's status does not allow the operation (approve a job that is not parked, ...).

    Two operations racing on one row (say approve and cancel) cannot both win: the loser gets this error,
    naming the status the winner left.
    """


class AttemptFenced(StoreError):
    """The row is no longer this process's to write; it must stop without touching the row.

    A later attempt (or a same-attempt successor) owns the job, the reaper took it, or its status is one
    the write did not expect: a terminal row (COMPLETED, FAILED, DEAD_LETTER) is never rewritten.
    """


class CallError(AgentlifeError):
    """An LLM or tool call failed."""


class TransientError(CallError):
    """A failure that may pass: retried with jittered backoff while the budgets allow.

    Attributes:
        retry_after: seconds the server asked us to wait, when it said so.
    """

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class LLMTimeout(TransientError, TimeoutError):
    """An LLM stream made no progress in time.

    ``kind`` is ``"connect"`` (no first event), ``"chunk"`` (silence between events) or ``"total"``.
    """

    def __init__(self, kind: Literal["connect", "chunk", "total"], seconds: float) -> None:
        super().__init__(f"LLM stream {kind} timeout after {seconds:g} s")
        self.kind = kind
        self.seconds = seconds


class ToolTimeout(TransientError, TimeoutError):
    """A tool call outlived its timeout and was cancelled."""

    def __init__(self, tool: str, seconds: float) -> None:
        super().__init__(f"tool {tool!r} timed out after {seconds:g} s")
        self.tool = tool
        self.seconds = seconds


class PolicyUnavailable(TransientError):
    """The policy check of a restricted tool timed out or failed, so the call is refused (fail closed)."""


class MCPServerUnavailable(TransientError):
    """An MCP server could not be started or reached, or went away during a call.

    A server that went away is restarted once, at its next call; once that restart is used up or failed,
    its calls fail with `MCPToolError` instead, since no retry can bring it back within the attempt.
    """


class PermanentError(CallError):
    """A failure that retrying cannot fix."""


class OutputValidationError(PermanentError):
    """The model's structured answer (``output_type=``) did not fit the type, after every retry.

    Attributes:
        type_name: the name of the type asked for.
        problems: one line per problem of the last answer (``"score: Input should be a valid integer"``).
        attempts: how many answers were asked for (0 for one answer checked outside a call).
    """

    def __init__(self, type_name: str, problems: list[str], *, attempts: int = 0) -> None:
        tries = f" after {attempts} attempt{'s' if attempts != 1 else ''}" if attempts else ""
        super().__init__(f"the answer does not fit {type_name}{tries}: " + "; ".join(problems))
        self.type_name = type_name
        self.problems = problems
        self.attempts = attempts


class MCPToolError(PermanentError):
    """An MCP tool call came back with ``isError``, a result the SDK refused, or one over the size limit.

    Also the error of every call to a server that went away after its one restart was used up or failed.

    ``ctx.run_tool_calls`` sends it back to the model as a failed tool call.
    """


class LLMConfigurationError(CallError):
    """The LLM client is not configured (no API key) or was refused (401/403)."""


class MemoryUnavailable(AgentlifeError):
    """The memory store could not be used: unreachable, too slow, locked by another process, misconfigured.

    The runtime logs it as a warning and goes on without memories (hydration) or without writing them back.
    """


class JobFailed(AgentlifeError):
    """The job `Client.result` waited for ended FAILED, without a result.

    Its step returned ``Done(status="FAILED")``, its budget was spent, or its approval was rejected. Raised
    only for the final outcome: a job that crashed and is being retried is waited for to its end.

    Attributes:
        job_id: the job.
        status: its terminal status (``FAILED`` or ``DEAD_LETTER``).
        attempt: the attempt it ended on.
        last_error: the last entry of its crash history (a crash record, or the operator's cancel or
            reject record), as stored; None when it has none.
    """

    def __init__(
        self, message: str, *, job_id: str, status: str, attempt: int, last_error: dict[str, object] | None
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.status = status
        self.attempt = attempt
        self.last_error = last_error


class JobCancelled(JobFailed):
    """The job was cancelled (``job cancel``, `Client.cancel`, the console) before it finished: FAILED."""


class JobDeadLettered(JobFailed):
    """The job was given up after repeated crashes (DEAD_LETTER); `Client.retry` runs it again."""


class ResultTimeout(AgentlifeError, TimeoutError):
    """`Client.result` waited its whole timeout and the job had not ended: it goes on running.

    Attributes:
        job_id: the job.
        status: its status when the wait gave up.
        seconds: the timeout.
    """

    def __init__(self, job_id: str, status: str, seconds: float) -> None:
        super().__init__(f"job {job_id} has not ended after {seconds:g} s (it is {status})")
        self.job_id = job_id
        self.status = status
        self.seconds = seconds


class BudgetExhausted(AgentlifeError):
    """The job's token, cost or run-time budget is spent; the job ends FAILED."""


class BackgroundOperationRestricted(AgentlifeError):
    """A ``restricted=True`` tool was called for a job that has not been approved."""


class ApprovalRejected(BackgroundOperationRestricted):
    """The call a job was parked on was refused (``job reject``), or the job ended while it waited.

    Final: the job ends FAILED whatever the step does after it. Every later call of the step raises it
    again, ``ctx.run_tool_calls`` does not hand it to the model, and the process exits 0 with the row left
    as the operator set it.
    """


class ReplayMismatch(AgentlifeError):
    """A resumed step issued a different call than the journal recorded at the same call number.

    Raised instead of returning the recorded result, so a deploy that changed a step's calls (or its
    input) never receives another call's result. It names both calls by name and digest, never by
    argument values. `AgentProcess.replay_mismatch` = ``"rerun"`` runs the rest of the step afresh instead.

    Attributes:
        invocation_id: ``{job_id}/{step}/{call}`` of the call.
        recorded: the recorded call, ``name (digest)``.
        current: the call issued now, ``name (digest)``.
    """

    def __init__(self, invocation_id: str, recorded: str, current: str) -> None:
        super().__init__(
            f"replay mismatch at {invocation_id}: the journal recorded {recorded}, the step now calls "
            f"{current}; a changed step cannot be replayed (set replay_mismatch = 'rerun' to run it afresh)"
        )
        self.invocation_id = invocation_id
        self.recorded = recorded
        self.current = current


class ToolArgumentsInvalid(AgentlifeError):
    """The arguments a model sent for a tool do not fit its parameters; the tool was not called.

    ``ctx.run_tool_calls`` turns it into a ``tool_result`` with ``is_error: true`` and this message, so
    the model can correct itself.

    Attributes:
        tool: the tool's name.
        problems: one line per problem (``"path: missing (required)"``).
    """

    def __init__(self, tool: str, problems: list[str]) -> None:
        super().__init__(f"invalid arguments for tool {tool}: " + "; ".join(problems))
        self.tool = tool
        self.problems = problems


class UnreplayableValue(AgentlifeError, TypeError):
    """A tool result, ``ctx.state`` or ``Done.result`` holds a value the journal would not give back exactly.

    Refused before it is recorded: a resumed step must see the same value the live call returned.
    """


class SignalDuringImport(BaseException):
    """SIGTERM or SIGINT arrived while the agent's module was importing: the import is abandoned.

    A BaseException, like KeyboardInterrupt, so the module's own ``except Exception`` cannot swallow it.
    Not public: the CLI turns it into exit 143 before any job state exists.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


# -- control flow: not errors users catch, never exported ---------------------------------------------------


#: The argument of the `ParkRequested` raised when an operator paused a job waiting for approval.
PAUSED_AT_APPROVAL = "paused by an operator"
#: The argument of the `ParkRequested` raised when an operator's pause stops a job before its next step.
PAUSED_AT_BOUNDARY = "paused between steps"


class ParkRequested(BaseException):
    """Raised inside a step when the approval idle timeout expired: the job parks and the process exits 0.

    A BaseException so an agent's ``except Exception`` cannot swallow it.
    """


class WaitParked(ParkRequested):
    """Raised inside a step at a durable wait that will not end in this process: the step ends at the wait.

    The runtime writes the park checkpoint (the wait's start is carried past its marker) and sets the row
    WAITING until ``until`` (unix time), exiting 0, or, when a drain interrupted a short wait, exits as
    drained; either way the next attempt replays the step to the wait and waits only for what is left.
    """

    def __init__(self, until: float, waiting_for: dict[str, object], *, drained: bool = False) -> None:
        super().__init__(until)
        self.until = until
        self.waiting_for = waiting_for
        self.drained = drained


class BootFailure(Exception):
    """A boot or hydration failure that ends the process with exit 1 after one clear log line."""


# -- describing errors in one line ---------------------------------------------------------------------------


def leaf_exceptions(exc: BaseException) -> list[BaseException]:
    """The exceptions an exception group holds, at any depth, in order; ``[exc]`` for any other."""
    if not isinstance(exc, BaseExceptionGroup):
        return [exc]
    return [leaf for inner in exc.exceptions for leaf in leaf_exceptions(inner)]


def describe_error(
    exc: BaseException, *, redact: Callable[[str], str] | None = None, limit: int | None = None
) -> str:
    """``Type: message`` on one line (the type alone when the message is empty); a group as its leaves.

    A group reads as its type, then each leaf's line, joined by ``; ``: a task group's failure reads
    ``ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)`` on its own, which says nothing
    of what failed. The message's lines are joined with spaces.

    Args:
        exc: the error.
        redact: masks each leaf's text before its lines are joined and before the cut, so neither can
            leave a piece of a secret that no longer looks like one (a key split across two lines).
        limit: the most characters returned (None: all).
    """
    if isinstance(exc, BaseExceptionGroup):
        leaves = "; ".join(describe_error(leaf, redact=redact) for leaf in leaf_exceptions(exc))
        text = f"{type(exc).__name__}: {leaves}"
    else:
        message = str(exc)
        text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        if redact is not None:
            text = redact(text)
        text = " ".join(text.splitlines())
    return text if limit is None else text[:limit]
