"""Running one tool function: its timeout, its worker thread, and what it raises that is not an Exception.

Also what a journal record says of a recorded call (`read_only`, `recorded_refusal`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import anyio.to_thread

from agentlife._exceptions import PermanentError, ToolTimeout, UnreplayableValue
from agentlife._journal._recovery import ToolRecord
from agentlife._tools import ToolSpec

__all__ = ["call_with_timeout", "read_only", "recorded_refusal"]


def read_only(record: ToolRecord, spec: ToolSpec[..., Any]) -> bool:
    """Whether a recorded call was to a tool without side effects.

    The record says so itself; a journal older than that field is trusted only for the same tool.
    """
    if record.side_effects is not None:
        return not record.side_effects
    return record.tool == spec.name and not spec.side_effects


def recorded_refusal(record: ToolRecord) -> Exception:
    """The error a completed call's refused result was recorded with, raised again on replay."""
    message = record.error or f"tool {record.tool}'s result was refused by the journal"
    if record.error_class == "UnreplayableValue":
        return UnreplayableValue(message)
    return PermanentError(f"{record.error_class}: {message}")


async def call_with_timeout(spec: ToolSpec[..., Any], args: dict[str, Any], timeout: float) -> Any:
    """Run the tool under its timeout; what it raises that is not an `Exception` becomes a `PermanentError`.

    A tool that raises `SystemExit` (a click command run in-process), `KeyboardInterrupt`,
    `GeneratorExit`, another `BaseException`, or a `CancelledError` of its own while nobody cancelled it,
    would otherwise tear through the step loop and skip the crash record and the cleanup. A cancellation
    that came from outside (the drain, the tool's timeout) is ours and goes on.
    """
    try:
        return await _call_tool_fn(spec, args, timeout)
    except Exception:
        raise
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError) and _being_cancelled():
            raise
        raise _not_an_exception(spec, exc) from exc


def _not_an_exception(spec: ToolSpec[..., Any], exc: BaseException) -> PermanentError:
    return PermanentError(
        f"tool {spec.name!r} raised {type(exc).__name__}({_short(exc)}), which is not an Exception"
    )


def _run_sync_tool(spec: ToolSpec[..., Any], args: dict[str, Any]) -> Any:
    """Run a sync tool on its worker thread, converting a BaseException before it reaches the loop.

    A GeneratorExit raised into a coroutine breaks the coroutine itself.
    """
    try:
        return spec.fn(**args)
    except Exception:
        raise
    except BaseException as exc:
        raise _not_an_exception(spec, exc) from exc


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _short(exc: BaseException) -> str:
    return ", ".join(repr(arg) for arg in exc.args)[:200]


async def _call_tool_fn(spec: ToolSpec[..., Any], args: dict[str, Any], timeout: float) -> Any:
    try:
        with anyio.fail_after(timeout):
            if spec.is_async:
                return await spec.fn(**args)
            # A sync tool that ignores cancellation is abandoned on its worker thread at the deadline;
            # the process-level hard deadline guarantees it cannot hold the exit.
            return await anyio.to_thread.run_sync(_run_sync_tool, spec, args, abandon_on_cancel=True)
    except TimeoutError as exc:
        if isinstance(exc, ToolTimeout):
            raise
        raise ToolTimeout(spec.name, timeout) from None
