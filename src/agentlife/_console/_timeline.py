"""A job's lifecycle as spans on one time axis, and that axis drawn as an inline SVG.

The spans come from the session journals' timed events when the console can read them: each session
(attempt) with its lifecycle phases (bootstrap: booting, hydrating, ready; execution: executing,
draining), each step from ``STEP_STARTED`` to its checkpoint, each model call and tool call as a bar, and
the moments that matter as marks (a drain, a retry, a refused call, the exit, a crash: a session with no
end whose process is not alive now). Without a journal the row's crash history gives the marks. Every
field is read defensively: a journal may come from another version, a torn disk or a process killed while
booting, and a bad field drops one span, never the page. The events and the history come masked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from agentlife._journal._writer import EventType

__all__ = ["LANES", "Mark", "Session", "Span", "Timeline", "build_timeline", "render_svg"]

#: The rows of the drawing, top to bottom.
LANES = ("phase", "step", "llm", "tool", "mark")
_LANE_LABEL = {
    "phase": "phases",
    "step": "steps",
    "llm": "model calls",
    "tool": "tool calls",
    "mark": "events",
}
_BOOTSTRAP = frozenset({"BOOTING", "HYDRATING", "READY"})
#: The most spans drawn: a job of 10 000 steps gets a readable picture of its first ones and a note.
MAX_SPANS = 1500
_WIDTH, _LEFT, _LANE_H, _TOP = 960, 96, 26, 24


@dataclass(frozen=True, slots=True)
class Span:
    """One bar: ``lane`` is one of `LANES`; ``kind`` styles it (a CSS class)."""

    lane: str
    start: float
    end: float
    label: str
    kind: str
    attempt: Any = None


@dataclass(frozen=True, slots=True)
class Mark:
    """One instant: a drain, a retry, an exit, a crash, a history entry."""

    at: float
    label: str
    kind: str
    attempt: Any = None


@dataclass(slots=True)
class Session:
    """The events of one session file, already redacted, with how many lines were unreadable."""

    name: str
    events: list[Mapping[str, Any]]
    bad_lines: int = 0
    truncated: bool = False


@dataclass(slots=True)
class Timeline:
    """What `render_svg` draws, and the ordered list the page prints under it."""

    spans: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    source: str = "journal"
    dropped: int = 0

    @property
    def bounds(self) -> tuple[float, float] | None:
        """The first and last time on the axis, or None when there is nothing to draw."""
        times = [t for s in self.spans for t in (s.start, s.end)] + [m.at for m in self.marks]
        return (min(times), max(times)) if times else None

    def ordered(self) -> list[Span | Mark]:
        """Every span and mark by start time, spans before marks at the same instant."""
        items: list[Span | Mark] = [*self.spans, *self.marks]
        return sorted(items, key=lambda i: (i.start if isinstance(i, Span) else i.at, isinstance(i, Mark)))


def build_timeline(
    sessions: Sequence[Session], history: Iterable[Any] = (), live: str | None = None
) -> Timeline:
    """The spans of every session, oldest first; the crash history's entries when no session is readable.

    ``live`` says what holds the job now (a process with a fresh heartbeat, parked on an approval or
    running): the newest session's missing end is then that, not a crash.
    """
    timeline = Timeline()
    for index, session in enumerate(sessions):
        _add_session(timeline, session, live if index == len(sessions) - 1 else None)
    if not timeline.spans and not timeline.marks:
        timeline.source = "row"
        for entry in history:
            if isinstance(entry, Mapping) and (at := _ts(entry.get("at"))) is not None:
                what = entry.get("error_class") or entry.get("event") or entry.get("decision") or "entry"
                who = f" by {_text(entry['actor'])}" if isinstance(entry.get("actor"), str) else ""
                label = f"{_text(what)}{who}: {_text(entry.get('message'))}"
                timeline.marks.append(Mark(at, label, "crash"))
    if len(timeline.spans) > MAX_SPANS:
        timeline.dropped = len(timeline.spans) - MAX_SPANS
        timeline.spans = timeline.spans[:MAX_SPANS]
    return timeline


def _add_session(timeline: Timeline, session: Session, live: str | None) -> None:
    timed = [(t, e) for e in session.events if (t := _ts(e.get("ts"))) is not None]
    if not timed:
        return
    last = timed[-1][0]
    started = next((e for _, e in timed if e.get("type") == EventType.SESSION_STARTED), {})
    attempt = started.get("attempt")
    ended = next((e for _, e in reversed(timed) if e.get("type") == EventType.SESSION_ENDED), None)
    _phases(timeline, timed, last, attempt)
    _steps_and_calls(timeline, timed, last, attempt)
    for at, event in timed:
        mark = _mark(event, at, attempt)
        if mark is not None:
            timeline.marks.append(mark)
    if ended is None and live is not None:
        timeline.marks.append(Mark(last, f"no SESSION_ENDED yet: {live}", "live", attempt))
    elif ended is None:
        timeline.marks.append(Mark(last, "no SESSION_ENDED: crashed or killed", "crash", attempt))


def _phases(
    timeline: Timeline, timed: list[tuple[float, Mapping[str, Any]]], last: float, attempt: Any
) -> None:
    changes = [(t, _text(e.get("to"))) for t, e in timed if e.get("type") == EventType.LIFECYCLE]
    if not changes:  # a process killed while booting, before its first LIFECYCLE line: no phases
        return
    ends = [t for t, _ in changes[1:]] + [last]
    for (start, state), end in zip(changes, ends, strict=True):
        if state == "TERMINATED":
            continue
        phase = "bootstrap" if state in _BOOTSTRAP else "execution"
        timeline.spans.append(Span("phase", start, end, f"{state.lower()} ({phase})", phase, attempt))


def _steps_and_calls(
    timeline: Timeline, timed: list[tuple[float, Mapping[str, Any]]], last: float, attempt: Any
) -> None:
    open_step: tuple[float, Any] | None = None
    open_calls: dict[tuple[str, Any], tuple[float, Mapping[str, Any]]] = {}
    for at, event in timed:
        kind = event.get("type")
        if open_step is not None and (
            (
                kind == EventType.CHECKPOINT_WRITTEN
                and event.get("step") == open_step[1]
                and not event.get("resumed")
            )
            or kind in (EventType.STEP_STARTED, EventType.SESSION_ENDED, EventType.WAIT_PARKED)
        ):
            how = "checkpointed" if kind == EventType.CHECKPOINT_WRITTEN else "no checkpoint"
            timeline.spans.append(_step(open_step, at, how, attempt))
            open_step = None
        if kind == EventType.STEP_STARTED:
            open_step = (at, event.get("step"))
        elif kind in (EventType.LLM_STARTED, EventType.TOOL_STARTED):
            lane = "llm" if kind == EventType.LLM_STARTED else "tool"
            open_calls[(lane, _call_key(event))] = (at, event)
        elif kind in (EventType.LLM_COMPLETED, EventType.TOOL_COMPLETED, EventType.TOOL_FAILED):
            lane = "llm" if kind == EventType.LLM_COMPLETED else "tool"
            start = open_calls.pop((lane, _call_key(event)), (at, event))
            timeline.spans.append(_call(lane, start[0], at, start[1], event, attempt))
    if open_step is not None:
        timeline.spans.append(_step(open_step, last, "unfinished", attempt))
    for (lane, _), (at, event) in open_calls.items():
        timeline.spans.append(
            Span(lane, at, last, f"{_call_name(lane, event)}: no completion", "open", attempt)
        )


def _step(open_step: tuple[float, Any], end: float, how: str, attempt: Any) -> Span:
    kind = "step" if how == "checkpointed" else "step-open"
    return Span("step", open_step[0], end, f"step {_text(open_step[1])} ({how})", kind, attempt)


def _call(
    lane: str, start: float, end: float, started: Mapping[str, Any], done: Mapping[str, Any], attempt: Any
) -> Span:
    name = _call_name(lane, started if started is not done else done)
    if done.get("type") == EventType.TOOL_FAILED:
        return Span(lane, start, end, f"{name}: failed, {_text(done.get('error_class'))}", "failed", attempt)
    if lane == "llm":
        usage = done.get("usage")
        if isinstance(usage, Mapping):
            name += f": {_text(usage.get('input_tokens'))} in / {_text(usage.get('output_tokens'))} out"
    return Span(lane, start, end, name, lane, attempt)


def _call_name(lane: str, event: Mapping[str, Any]) -> str:
    if lane == "llm":
        model = event.get("model")
        return f"model call {_text(event.get('call'))}" + (f" {_text(model)}" if model else "")
    return f"tool {_text(event.get('tool'))} (call {_text(event.get('call'))})"


def _mark(event: Mapping[str, Any], at: float, attempt: Any) -> Mark | None:
    kind = event.get("type")
    if kind == EventType.DRAIN_STARTED:
        return Mark(at, f"drain: {_text(event.get('reason'))}", "drain", attempt)
    if kind == EventType.SESSION_ENDED:
        code = event.get("exit_code")
        return Mark(at, f"exit code {_text(code)}", "exit" if code == 0 else "exit-bad", attempt)
    if kind == EventType.SESSION_STARTED:
        return Mark(at, f"attempt {_text(attempt)} started (pid {_text(event.get('pid'))})", "start", attempt)
    if kind == EventType.RETRY:
        return Mark(at, f"retry after {_text(event.get('error_class'))}", "retry", attempt)
    if kind == EventType.TOOL_REFUSED:
        return Mark(
            at, f"refused tool {_text(event.get('tool'))}: {_text(event.get('reason'))}", "retry", attempt
        )
    if kind in (EventType.WAIT_STARTED, EventType.WAIT_PARKED):
        return Mark(at, f"{str(kind).lower().replace('_', ' ')}: {_text(event.get('kind'))}", "wait", attempt)
    return None


# -- the drawing -------------------------------------------------------------------------------------------


def render_svg(timeline: Timeline) -> str:
    """The timeline as an inline ``<svg>`` (every text escaped), or the empty string when it is empty."""
    bounds = timeline.bounds
    if bounds is None:
        return ""
    t0, t1 = bounds
    scale = (_WIDTH - _LEFT - 12) / max(t1 - t0, 1e-3)
    height = _TOP + _LANE_H * len(LANES) + 8
    out = [
        f'<svg class="timeline" viewBox="0 0 {_WIDTH} {height}" width="100%" role="img"'
        f' aria-labelledby="timeline-title" preserveAspectRatio="xMinYMin meet">',
        f'<title id="timeline-title">Lifecycle timeline, {_duration(t1 - t0)} from the first event'
        " to the last; the list below gives every bar in order</title>",
    ]
    for index, lane in enumerate(LANES):
        y = _TOP + index * _LANE_H
        out.append(f'<text class="lane" x="4" y="{y + 17}">{_LANE_LABEL[lane]}</text>')
        out.append(f'<line class="grid" x1="{_LEFT}" x2="{_WIDTH}" y1="{y + _LANE_H}" y2="{y + _LANE_H}"/>')
    out += _axis(t0, t1, scale)
    for span in timeline.spans:
        x = _LEFT + (span.start - t0) * scale
        w = max((span.end - span.start) * scale, 2.0)
        y = _TOP + LANES.index(span.lane) * _LANE_H + 4
        tip = escape(f"{span.label} ({_duration(span.end - span.start)})")
        out.append(
            f'<rect class="bar {escape(span.kind)}" x="{x:.1f}" y="{y}" width="{w:.1f}"'
            f' height="{_LANE_H - 8}"><title>{tip}</title></rect>'
        )
    y = _TOP + LANES.index("mark") * _LANE_H + 4
    for mark in timeline.marks:
        x = _LEFT + (mark.at - t0) * scale
        points = f"{x:.1f},{y} {x + 5:.1f},{y + 9} {x:.1f},{y + 18} {x - 5:.1f},{y + 9}"
        out.append(
            f'<polygon class="mark {escape(mark.kind)}" points="{points}">'
            f"<title>{escape(mark.label)}</title></polygon>"
        )
    out.append("</svg>")
    return "".join(out)


def _axis(t0: float, t1: float, scale: float) -> list[str]:
    out = []
    for i in range(5):
        t = t0 + (t1 - t0) * i / 4
        x = _LEFT + (t - t0) * scale
        anchor = "end" if i == 4 else "start"
        out.append(
            f'<text class="tick" x="{x:.1f}" y="14" text-anchor="{anchor}">+{_duration(t - t0)}</text>'
        )
    return out


# -- small helpers -------------------------------------------------------------------------------------------


def _ts(value: Any) -> float | None:
    if (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value == value
        and abs(value) < 1e12
    ):
        return float(value)
    return None


def _text(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _call_key(event: Mapping[str, Any]) -> Any:
    invocation = event.get("invocation_id")
    if isinstance(invocation, str):
        return invocation
    return (_text(event.get("step")), _text(event.get("call")))


def _duration(seconds: float) -> str:
    """Seconds as people read them: ``850 ms``, ``2.4 s``, ``3 min 5 s``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)} min {rest:.0f} s"
