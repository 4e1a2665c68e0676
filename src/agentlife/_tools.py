"""The ``@tool`` decorator and the sentinel `NOT_DONE`."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Generic, ParamSpec, TypeVar, overload

from agentlife._schema import tool_definition

__all__ = ["NOT_DONE", "NotDone", "ToolSpec", "loaded_mcp", "tool"]

P = ParamSpec("P")
R = TypeVar("R")


class NotDone:
    """Type of `NOT_DONE`: what a ``verify`` callback returns when the side effect did not happen."""

    _instance: NotDone | None = None

    def __new__(cls) -> NotDone:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "agentlife.NOT_DONE"

    def __reduce__(self) -> str:
        return "NOT_DONE"


NOT_DONE: Final = NotDone()
"""What a tool's ``verify`` returns when the side effect of a call found pending did not happen.

After a crash or a drain, a side-effecting call the journal holds as started but not completed is settled
by asking ``verify(invocation_id)``: it returns the call's result when the effect already happened (the
result is journaled and the tool is not run), or ``NOT_DONE`` to run the tool again. A singleton that
survives pickling, compared with ``is``.
"""

Verify = Callable[[str], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class ToolSpec(Generic[P, R]):
    """A function made into a tool: its name, timeout and policy flags.

    Calling the spec calls the function directly (handy in unit tests); inside a step, go through
    ``ctx.call_tool(spec, ...)`` so the call is timed out, journaled and replayed.
    """

    fn: Callable[P, Awaitable[R]] | Callable[P, R]
    """The function itself (async, or sync: a sync tool runs on a worker thread, off the event loop)."""
    name: str
    """The tool's name: the function's unless given; it picks the default timeout from
    `DEFAULT_TOOL_TIMEOUTS`."""
    timeout: float | None
    """Seconds a call may take, overriding the per-tool table; None takes the table's or
    ``tool_default_timeout_seconds``."""
    side_effects: bool
    """True makes every call write-ahead journaled: durable before and after it runs, never repeated once
    recorded."""
    restricted: bool
    """The call needs an approved job and passes ``AgentProcess.check_policy`` first."""
    verify: Verify | None
    """``async verify(invocation_id)`` for a call found pending after a crash: the call's result when the
    effect already happened, or `NOT_DONE` to run the tool again."""
    is_async: bool
    """Whether ``fn`` is a coroutine function (derived by ``@tool``)."""
    wants_invocation_id: bool
    """Whether ``fn`` takes an ``invocation_id`` parameter, which the runtime then fills in (derived by
    ``@tool``)."""
    retries: int | None = None
    """How many times a call that failed with a transient error or a timeout runs again in this process; None:
    none for a side-effecting tool without ``verify``, unlimited within the step and run budgets otherwise."""
    #: What is derived from the function once and kept: its schema model and definition.
    _derived: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def definition(self) -> dict[str, Any]:
        """The model-facing definition ``{"name", "description", "input_schema"}``, derived once.

        The description is the docstring's first paragraph; each parameter's schema comes from its type
        hint and its description from the ``Args:`` section. ``invocation_id`` is not in it.
        """
        return tool_definition(self)

    @property
    def max_tries(self) -> int | None:
        """Tries of one call in this process (None: as many as the step and run budgets allow).

        ``retries`` when given; otherwise a side-effecting tool without ``verify`` runs once: retrying it
        after, say, a ``ConnectionError`` cannot know whether the effect already happened, and each retry
        would risk doing it again. Read-only tools, and side-effecting ones with ``verify`` (asked before
        every retry), retry transient errors within the budgets.
        """
        if self.retries is not None:
            return self.retries + 1
        if self.side_effects and self.verify is None:
            return 1
        return None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R] | R:
        return self.fn(*args, **kwargs)


@overload
def tool(fn: Callable[P, Awaitable[R]], /) -> ToolSpec[P, R]: ...


@overload
def tool(fn: Callable[P, R], /) -> ToolSpec[P, R]: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    timeout: float | None = None,
    side_effects: bool = True,
    restricted: bool = False,
    verify: Verify | None = None,
    retries: int | None = None,
) -> Callable[[Callable[P, Any]], ToolSpec[P, Any]]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    timeout: float | None = None,
    side_effects: bool = True,
    restricted: bool = False,
    verify: Verify | None = None,
    retries: int | None = None,
) -> Any:
    """Declare a tool.

    Args:
        fn: the function (async, or sync: sync tools run on a worker thread, off the event loop).
        name: defaults to the function's name; it picks the default timeout from the per-tool table
            in `agentlife.constants`.
        timeout: seconds, overriding the table.
        side_effects: ``True`` makes the call write-ahead journaled (durable before and after it runs).
        restricted: the call needs an approved job and passes ``AgentProcess.check_policy`` first.
        verify: ``async verify(invocation_id)`` for a call found pending after a crash: returns the call's
            result when the effect already happened, or `NOT_DONE` to run the tool again.
        retries: how many times a call that failed with a transient error or a timeout is run again in
            this process, within the step and run budgets. Default: none for a side-effecting tool
            without ``verify`` (the error fails the step; the next attempt runs the call again, the
            documented at-least-once), unlimited within the budgets otherwise. ``retries=0`` turns
            retrying off for any tool.

    Example:
        >>> @tool(timeout=10, side_effects=False)
        ... async def read_file(path: str) -> str:
        ...     return open(path).read()
    """

    def wrap(f: Callable[..., Any]) -> ToolSpec[Any, Any]:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"tool timeout must be > 0, got {timeout}")
        if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int) or retries < 0):
            raise ValueError(f"tool retries must be a whole number >= 0, got {retries!r}")
        params = inspect.signature(f).parameters
        return ToolSpec(
            fn=f,
            name=name or f.__name__,
            timeout=timeout,
            side_effects=side_effects,
            restricted=restricted,
            verify=verify,
            is_async=inspect.iscoroutinefunction(f),
            wants_invocation_id="invocation_id" in params,
            retries=retries,
        )

    return wrap(fn) if fn is not None else wrap


def loaded_mcp() -> Any:
    """The MCP server module when something has imported it, else None.

    An `MCPServer` or a tool reference of one can only exist once its module is imported, so a job whose
    agent lists no server never loads the MCP code: start-up is paid by every job.
    """
    return sys.modules.get("agentlife._mcp._server")
