"""``ctx.publish``, and the tap that hands a streaming model reply's text to the job's followers.

``publish`` is a journaled call (``agentlife.publish``, without side effects in the journal's sense): its
effect, the output row, is keyed in the store by the job and the call's invocation id, and fenced like the
step's records. A step that resumes after a crash gets the recorded ``seq`` back when the call completed;
when it had started and not finished, the call runs again and the store finds the row it wrote, if any:
either way the row is written once, and a follower sees the event once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from agentlife._llm._protocol import OnEvent, StreamEvent
from agentlife._tools import tool
from agentlife.stores._output import check_output

if TYPE_CHECKING:
    from agentlife._output._deltas import DeltaBuffer
    from agentlife._step._context import StepContext

__all__ = ["PUBLISH_TOOL", "OutputCalls", "publish", "tap_deltas"]

#: The name the call is journaled under.
PUBLISH_TOOL = "agentlife.publish"


class OutputCalls:
    """``ctx.publish`` of `StepContext` (kept here so the context module stays one concern)."""

    async def publish(self, name: str, value: Any = None) -> None:
        """Publish the event ``name`` with ``value`` (JSON) to the job's followers.

        A journaled call: a resumed step does not publish it again, whichever pod resumes it, and a
        follower sees it once. Secrets in ``value`` are masked as in every row the job writes. Cheap, but a
        store write each: publish progress (a phase, a count, a partial result), not every token (a
        streaming model reply reaches followers by itself).

        Raises:
            ConfigError: an empty name, one over 200 characters or holding control characters; a value
                that is not JSON or over 64 KiB of it; or the job's output already holds 10,000 events.
                Nothing was published.
        """
        await publish(_ctx(self), name, value)


def _ctx(calls: OutputCalls) -> StepContext:
    return calls  # type: ignore[return-value]  # mixed into StepContext only


async def publish(ctx: StepContext, name: object, value: Any) -> int:
    """``ctx.publish``: see `OutputCalls.publish`; the event's ``seq`` in the job's output."""
    check_output(name, value)  # before anything is journaled or written
    assert isinstance(name, str)  # checked above
    booted = ctx._env.approvals.booted
    store, job_id, attempt = booted.store, booted.settings.job_id, booted.settings.attempt
    masked = orjson.dumps(ctx._env.host.redactor.redact_obj(value))

    async def write(name: str, invocation_id: str) -> int:
        """Write the output row of this call (once per invocation id)."""
        return await store.publish_output(job_id, attempt, invocation_id, name, masked)

    # The value is not an argument of the journaled call: a resumed step that publishes another value
    # under the same call (a time, an attempt number) keeps the first, on every pod, instead of failing
    # the digest check of a call whose event followers already saw. The name still is: another name at
    # that call is another step.
    spec = tool(name=PUBLISH_TOOL, side_effects=False)(write)
    seq: int = await ctx.call_tool(spec, name=name)
    return seq


def tap_deltas(deltas: DeltaBuffer, call: str, on_event: OnEvent | None) -> OnEvent:
    """The ``on_event`` a streaming call gets: text goes to ``deltas``, every event on to ``on_event``."""
    add = deltas.add

    def tapped(event: StreamEvent) -> None:
        if event.kind == "text":
            add(call, event.text)
        if on_event is not None:
            on_event(event)

    return tapped
