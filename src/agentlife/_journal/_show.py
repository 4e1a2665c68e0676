"""``python -m agentlife journal show PATH``: a session file as a readable timeline.

Times are relative to the first event. Steps, LLM calls and tool calls get durations: a step lasts from
its ``STEP_STARTED`` to its checkpoint marker (else to the next step or the end of the session), a call
from its ``*_STARTED`` to its completion. Torn and corrupt lines are listed where they occur
(``line N: corrupt, skipped``) and never stop the timeline. Every field is read defensively: the file
may have been written by another version or damaged.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentlife._exceptions import ConfigError
from agentlife._journal._recovery import BadLine, read_events
from agentlife._journal._writer import Event, EventType

__all__ = ["format_timeline"]

_PREVIEW = 60
_REFUSAL_PREVIEW = 200
_STEP_END = (EventType.STEP_STARTED, EventType.SESSION_ENDED)


def format_timeline(path: Path) -> str:
    """The timeline of the session file at ``path`` as text (no trailing newline).

    Raises:
        ConfigError: the file does not exist or cannot be read.
    """
    path = Path(path)
    try:
        items: list[Event | BadLine] = list(read_events(path))
    except FileNotFoundError:
        raise ConfigError(f"journal file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory, not a journal file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read journal {path}: {exc.strerror or exc}") from None
    return _Timeline(path, items).render()


class _Timeline:
    def __init__(self, path: Path, items: list[Event | BadLine]) -> None:
        self.path = path
        self.items = items
        self.events = [(i, item) for i, item in enumerate(items) if not isinstance(item, BadLine)]
        self.t0 = next((t for _, e in self.events if (t := _ts(e)) is not None), None)
        self.ends = self._pair_calls()
        self.step_ends = self._step_ends()
        self.consumed = {end for end in self.ends.values()}

    # -- pairing ---------------------------------------------------------------------------------------------

    def _pair_calls(self) -> dict[int, int]:
        """Start index -> index of its completion, for LLM and tool calls."""
        open_calls: dict[tuple[str, Any], int] = {}
        ends: dict[int, int] = {}
        for index, event in self.events:
            kind = event.get("type")
            if kind == EventType.LLM_STARTED:
                open_calls[("llm", _call_key(event))] = index
            elif kind == EventType.TOOL_STARTED:
                open_calls[("tool", _call_key(event))] = index
            elif kind == EventType.LLM_COMPLETED:
                start = open_calls.pop(("llm", _call_key(event)), None)
                if start is not None:
                    ends[start] = index
            elif kind in (EventType.TOOL_COMPLETED, EventType.TOOL_FAILED):
                start = open_calls.pop(("tool", _call_key(event)), None)
                if start is not None:
                    ends[start] = index
        return ends

    def _step_ends(self) -> dict[int, tuple[int, str]]:
        """STEP_STARTED index -> (index of the event that ends it, how it ended)."""
        out: dict[int, tuple[int, str]] = {}
        current: tuple[int, Any] | None = None
        for index, event in self.events:
            kind = event.get("type")
            if current is not None:
                start, step = current
                if kind == EventType.CHECKPOINT_WRITTEN and _hashable(event.get("step")) == step:
                    out[start] = (index, "checkpointed")
                    current = None
                elif kind in _STEP_END:
                    out[start] = (index, "no checkpoint")
                    current = None
            if kind == EventType.STEP_STARTED:
                current = (index, _hashable(event.get("step")))
        if current is not None and self.events:
            out[current[0]] = (self.events[-1][0], "unfinished")
        return out

    # -- rendering -------------------------------------------------------------------------------------------

    def render(self) -> str:
        lines = self._header()
        for index, item in enumerate(self.items):
            if isinstance(item, BadLine):
                lines.append(f"{'':>11}  line {item.line_no}: corrupt, skipped ({item.reason})")
                continue
            if index in self.consumed:
                continue
            text = self._describe(index, item)
            lines.append(f"{self._rel(item):>11}  {_indent(item)}{text}")
        return "\n".join(lines)

    def _header(self) -> list[str]:
        bad = sum(isinstance(i, BadLine) for i in self.items)
        started = next((e for _, e in self.events if e.get("type") == EventType.SESSION_STARTED), None)
        head = f"{self.path.name}"
        if started is not None:
            who = ", ".join(
                f"{label} {_short(started.get(key))}"
                for key, label in (
                    ("job_id", "job"),
                    ("agent_id", "agent"),
                    ("attempt", "attempt"),
                    ("pid", "pid"),
                )
                if started.get(key) is not None
            )
            head += f": {who}" if who else ""
        lines = [head]
        when = _utc(self.t0) if self.t0 is not None else "unknown start time"
        count = len(self.events)
        summary = f"started {when}; {count} event{'s' if count != 1 else ''}"
        if bad:
            summary += f", {bad} corrupt line{'s' if bad != 1 else ''}"
        ended = next((e for _, e in reversed(self.events) if e.get("type") == EventType.SESSION_ENDED), None)
        if ended is not None:
            summary += f"; ended with exit code {_short(ended.get('exit_code'))}"
        elif self.events:
            summary += "; no SESSION_ENDED (crashed, killed or still running)"
        lines.append(summary)
        lines.append("")
        return lines

    def _rel(self, event: Event) -> str:
        ts = _ts(event)
        if ts is None or self.t0 is None:
            return "?"
        return f"+{ts - self.t0:.3f}s"

    def _span(self, start: int, end: int) -> str:
        a, b = _ts(_event(self.items[start])), _ts(_event(self.items[end]))
        if a is None or b is None:
            return "?"
        return _duration(b - a)

    def _describe(self, index: int, event: Event) -> str:
        kind = event.get("type")
        describe = _DESCRIBERS.get(str(kind))
        text = describe(self, index, event) if describe is not None else _generic(event)
        if event.get("carried") is True:
            text += " [carried from the previous session]"
        return text

    def _step(self, index: int, event: Event) -> str:
        text = f"step {_short(event.get('step'))} started"
        end = self.step_ends.get(index)
        if end is None or end[0] == index:
            return text + " (unfinished)"
        if end[1] == "unfinished":
            return text + f" (unfinished, at least {self._span(index, end[0])})"
        return text + f" ({self._span(index, end[0])}, {end[1]})"

    def _llm_start(self, index: int, event: Event) -> str:
        text = f"llm call {_short(event.get('call'))}"
        if event.get("model"):
            text += f" {_short(event.get('model'))}"
        end = self.ends.get(index)
        if end is None:
            return text + ": no completion recorded (re-issued on resume)"
        return text + f": {_llm_outcome(_event(self.items[end]))} ({self._span(index, end)})"

    def _llm_done(self, index: int, event: Event) -> str:
        text = f"llm call {_short(event.get('call'))}: {_llm_outcome(event)}"
        duration = event.get("duration_ms")
        if isinstance(duration, (int, float)) and not isinstance(duration, bool):
            text += f" ({_duration(duration / 1000)})"
        return text

    def _tool_start(self, index: int, event: Event) -> str:
        text = f"tool call {_short(event.get('call'))} {_short(event.get('tool'))}"
        if event.get("invocation_id"):
            text += f" [{_short(event.get('invocation_id'))}]"
        end = self.ends.get(index)
        if end is None:
            return text + ": pending (no completion recorded)"
        return text + f": {_tool_outcome(_event(self.items[end]))} ({self._span(index, end)})"

    def _tool_done(self, index: int, event: Event) -> str:
        text = f"tool call {_short(event.get('call'))}"
        if event.get("tool"):
            text += f" {_short(event.get('tool'))}"
        return text + f": {_tool_outcome(event)}"


def _lifecycle(_: _Timeline, __: int, event: Event) -> str:
    return f"state {_short(event.get('from'))} -> {_short(event.get('to'))}"


def _session_started(_: _Timeline, __: int, event: Event) -> str:
    extra = {k: v for k, v in event.items() if k not in ("v", "ts", "seq", "type")}
    return "session started " + _fields(extra)


def _checkpoint(_: _Timeline, __: int, event: Event) -> str:
    cid = event.get("checkpoint_id")
    if event.get("resumed"):
        # The marker a session writes after hydration, so the next attempt's scan finds its place here.
        if cid is None:
            return "resume point: fresh job, starting at step 0"
        step = event.get("step")
        resumes_at = step + 1 if isinstance(step, int) and not isinstance(step, bool) else "?"
        return f"resume point: checkpoint {_short(cid)}, resuming at step {resumes_at}"
    text = f"checkpoint {_short(cid) if cid is not None else '(fresh job, no checkpoint yet)'}"
    if event.get("step") is not None:
        text += f" after step {_short(event.get('step'))}"
    crc = event.get("crc")
    if isinstance(crc, int) and not isinstance(crc, bool):
        text += f" crc={crc & 0xFFFFFFFF:08x}"
    return text


def _retry(_: _Timeline, __: int, event: Event) -> str:
    what = f"{_short(event.get('kind') or 'call')} call {_short(event.get('call'))}"
    text = f"retry {what} after {_short(event.get('error_class'))}: {_preview(event.get('error'))}"
    delay = event.get("delay")
    if isinstance(delay, (int, float)) and not isinstance(delay, bool):
        text += f" (waiting {_duration(delay)})"
    return text


def _refused(_: _Timeline, __: int, event: Event) -> str:
    text = f"tool call refused: {_short(event.get('tool'))}"
    if event.get("tool_use_id"):
        text += f" [{_short(event.get('tool_use_id'))}]"
    # What the model was told is the point of the line: more of it than of a tool's result.
    return text + f", {_short(event.get('reason'))}: {_preview(event.get('error'), _REFUSAL_PREVIEW)}"


def _drain(_: _Timeline, __: int, event: Event) -> str:
    return f"drain started: {_short(event.get('reason'))}"


def _ended(_: _Timeline, __: int, event: Event) -> str:
    return f"session ended, exit code {_short(event.get('exit_code'))}"


_Describer = Callable[[_Timeline, int, Event], str]
_DESCRIBERS: Mapping[str, _Describer] = {
    EventType.SESSION_STARTED: _session_started,
    EventType.LIFECYCLE: _lifecycle,
    EventType.STEP_STARTED: _Timeline._step,
    EventType.LLM_STARTED: _Timeline._llm_start,
    EventType.LLM_COMPLETED: _Timeline._llm_done,
    EventType.TOOL_STARTED: _Timeline._tool_start,
    EventType.TOOL_COMPLETED: _Timeline._tool_done,
    EventType.TOOL_FAILED: _Timeline._tool_done,
    EventType.CHECKPOINT_WRITTEN: _checkpoint,
    EventType.RETRY: _retry,
    EventType.TOOL_REFUSED: _refused,
    EventType.DRAIN_STARTED: _drain,
    EventType.SESSION_ENDED: _ended,
}
_IN_STEP = frozenset(
    {
        EventType.LLM_STARTED,
        EventType.LLM_COMPLETED,
        EventType.TOOL_STARTED,
        EventType.TOOL_COMPLETED,
        EventType.TOOL_FAILED,
        EventType.TOOL_REFUSED,
        EventType.RETRY,
    }
)


# -- small helpers -------------------------------------------------------------------------------------------


def _event(item: Event | BadLine) -> Event:
    return item if not isinstance(item, BadLine) else {}


def _ts(event: Event) -> float | None:
    ts = event.get("ts")
    if isinstance(ts, (int, float)) and not isinstance(ts, bool) and ts == ts and abs(ts) < 1e12:
        return float(ts)
    return None


def _hashable(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def _call_key(event: Event) -> Any:
    invocation = event.get("invocation_id")
    if isinstance(invocation, str):
        return invocation
    return (_hashable(event.get("step")), _hashable(event.get("call")))


def _indent(event: Event) -> str:
    return "    " if event.get("type") in _IN_STEP else ""


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 120:
        return f"{seconds:.3f} s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)} min {rest:.1f} s"


def _utc(ts: float) -> str:
    try:
        return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
    except (OverflowError, OSError, ValueError):
        return f"ts={ts}"


def _short(value: Any, limit: int = _PREVIEW) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _preview(value: Any, limit: int = _PREVIEW) -> str:
    return repr(_short(value, limit)) if isinstance(value, str) else _short(value, limit)


def _fields(fields: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={_short(v)}" for k, v in fields.items())


def _generic(event: Event) -> str:
    extra = {k: v for k, v in event.items() if k not in ("v", "ts", "seq", "type")}
    return f"{_short(event.get('type'))} {_fields(extra)}".rstrip()


def _llm_outcome(event: Event) -> str:
    response = event.get("response")
    response = response if isinstance(response, Mapping) else {}
    usage = event.get("usage")
    usage = usage if isinstance(usage, Mapping) else response.get("usage")
    parts = []
    if isinstance(usage, Mapping):
        parts.append(
            f"{_short(usage.get('input_tokens', '?'))} in / {_short(usage.get('output_tokens', '?'))} out"
        )
    if response.get("stop_reason"):
        parts.append(f"stop={_short(response.get('stop_reason'))}")
    if "text" in response:
        parts.append(_preview(response.get("text")))
    return "completed" + (", " + ", ".join(parts) if parts else "")


def _tool_outcome(event: Event) -> str:
    if event.get("type") == EventType.TOOL_FAILED:
        return f"failed, {_short(event.get('error_class'))}: {_preview(event.get('error'))}"
    if event.get("error_class") is not None:  # the effect happened; the journal refused its result
        return (
            f"completed, result refused: {_short(event.get('error_class'))}: {_preview(event.get('error'))}"
        )
    return f"completed -> {_preview(event.get('result'))}"
