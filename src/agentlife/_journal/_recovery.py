"""Reading session files back: torn-tolerant readers, the recovery scan and the replay map.

The recovery scan (hydration step 2) finds the newest session file and reads it **from the end** to the
``CHECKPOINT_WRITTEN`` whose checkpoint id equals the store's; its cost grows with the events after that
marker, not with the file. A torn last line, a corrupt line, a missing file or a marker mismatch never
fails hydration: the scan degrades to checkpoint-only resume and says why. `build_replay` turns the
events of the resumed step into a `ReplayMap`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeAlias

import orjson

from agentlife._journal._writer import Event, EventType, list_sessions
from agentlife.constants import HydrationConstants

__all__ = [
    "BadLine",
    "ReplayMap",
    "ScanResult",
    "ToolRecord",
    "ToolStatus",
    "WaitRecord",
    "build_replay",
    "iter_lines_reverse",
    "read_events",
    "scan_for_resume",
]

_log = logging.getLogger("agentlife.journal")

_BAD_LINE_PREVIEW = 120


# ------------------------------------------------------------------------------------------------ reading


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line that is not a journal event: torn, corrupt, or not an event object.

    Attributes:
        line_no: 1-based line number in the file.
        offset: byte offset of the line's start.
        reason: why it was rejected.
        raw: the first bytes of the line.
    """

    line_no: int
    offset: int
    reason: str
    raw: bytes = b""


def _parse_line(raw: bytes) -> Event | str:
    """The event on ``raw``, or the reason it is not one."""
    if not raw.strip():
        return "empty line"
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return f"not JSON ({str(exc).split(':', 1)[0]})"
    if not isinstance(value, dict):
        return f"not an event object ({type(value).__name__})"
    if not isinstance(value.get("type"), str):
        return "not an event (no type)"
    return value


def read_events(path: Path) -> Iterator[Event | BadLine]:
    """Every line of ``path`` in order: an `Event` dict, or a `BadLine` for a torn or corrupt line.

    Raises:
        OSError: the file cannot be opened (a missing file is the caller's to report).
    """
    offset = 0
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            parsed = _parse_line(raw)
            if isinstance(parsed, str):
                if not raw.endswith(b"\n"):
                    parsed = f"torn last line: {parsed}"
                yield BadLine(line_no, offset, parsed, raw[:_BAD_LINE_PREVIEW])
            else:
                yield parsed
            offset += len(raw)


def iter_lines_reverse(path: Path, chunk_size: int = 65536) -> Iterator[bytes]:
    """The lines of ``path``, last first, without their newlines, reading blocks from the end.

    Only as much of the file is read as the consumer asks for, so stopping after ``n`` lines costs about
    ``n`` lines of I/O whatever the file's size. A last line without a newline (torn) is yielded as is.

    Raises:
        OSError: the file cannot be opened or read.
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    with open(path, "rb") as f:
        pos = f.seek(0, os.SEEK_END)
        pieces: list[bytes] = []  # the start of the line being assembled, newest piece last
        at_end = True
        while pos > 0:
            size = min(chunk_size, pos)
            pos -= size
            f.seek(pos)
            block = f.read(size)
            if at_end:
                at_end = False
                if block.endswith(b"\n"):
                    block = block[:-1]
            parts = block.split(b"\n")
            if len(parts) == 1:
                pieces.append(block)
                continue
            yield parts[-1] + b"".join(reversed(pieces))
            yield from reversed(parts[1:-1])
            pieces = [parts[0]]
        if not at_end:  # the file was not empty: what is left is its first line
            yield b"".join(reversed(pieces))


# ------------------------------------------------------------------------------------------- recovery scan


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What the recovery scan found.

    Attributes:
        found: the marker of the store's checkpoint was found; ``events`` are valid for replay.
        reason: one line for the log, also when found (``degrading to checkpoint-only resume: <reason>``).
        path: the file the marker was found in (or the file the scan gave up on).
        events: the events after the marker, oldest first (empty when not found).
        scanned_lines: lines read (backwards) across all files.
        skipped_lines: corrupt or torn lines skipped.
        marker: the ``CHECKPOINT_WRITTEN`` event itself, when found.
        files_scanned: session files opened.
        elapsed_seconds: wall time of the scan.
        expected: when not found, whether that is a normal situation rather than lost or damaged data: a
            fresh job (no checkpoint, no session files or no marker yet) or a process killed between
            committing its checkpoint and journaling the marker. The runtime logs those at INFO and the
            rest at WARNING.
    """

    found: bool
    reason: str
    path: Path | None = None
    events: list[Event] = field(default_factory=list)
    scanned_lines: int = 0
    skipped_lines: int = 0
    marker: Event | None = None
    files_scanned: int = 0
    elapsed_seconds: float = 0.0
    expected: bool = False


class _BudgetSpent(Exception):
    pass


class _PastTarget(Exception):
    """Reading back reached a marker older than the store's checkpoint: it cannot lie further back."""

    def __init__(self, marker: Event, newest: Any) -> None:
        self.marker = marker
        self.newest = newest


_NO_MARKER = object()


@dataclass(slots=True)
class _Scan:
    deadline: float
    started: float
    floor_step: int | None = None
    #: The job row's incarnation: a fresh job's marker (null checkpoint id) matches only its own.
    incarnation: str | None = None
    #: Fresh-job markers read that another incarnation of the job id wrote.
    foreign: int = 0
    #: The lowest ``to_step`` of the ``REWOUND`` lines read so far (reading back): older events of later
    #: steps are the future an operator rewound away, never replayed.
    rewound_to: int | None = None
    scanned: int = 0
    skipped: int = 0
    files: int = 0

    def result(self, found: bool, reason: str, path: Path | None, **extra: Any) -> ScanResult:
        return ScanResult(
            found=found,
            reason=reason,
            path=path,
            scanned_lines=self.scanned,
            skipped_lines=self.skipped,
            files_scanned=self.files,
            elapsed_seconds=time.monotonic() - self.started,
            **extra,
        )

    def rewound(self, event: Event) -> None:
        """A ``REWOUND`` line: every older event of a step after its ``to_step`` is passed over."""
        to_step = _as_int(event.get("to_step"))
        if to_step is not None and (self.rewound_to is None or to_step < self.rewound_to):
            self.rewound_to = to_step

    def rewound_away(self, event: Event) -> bool:
        """Whether ``event`` (older than every ``REWOUND`` read) belongs to a step rewound away."""
        step = _as_int(event.get("step"))
        return self.rewound_to is not None and step is not None and step > self.rewound_to

    def own(self, marker: Event, target: str | None) -> bool:
        """Whether a marker of ``target`` was written by this incarnation of the job.

        A checkpoint id is unique per write, but every fresh job's marker says null: one of another job
        of the same id (another store sharing the data directory, a job whose tombstone expired) carries
        another incarnation, and a marker without one (older journals) belongs only to a row without one.
        """
        if target is not None or marker.get("incarnation") == self.incarnation:
            return True
        self.foreign += 1
        return False

    def scan_file(self, path: Path, target: str | None) -> tuple[Event | None, list[Event], Any]:
        """Read ``path`` backwards to the marker of ``target``: (marker or None, events after it, newest id).

        Markers of newer checkpoints are read past (the store fell back to an older checkpoint, whose step
        the journal may still replay); the newest marker's id is returned for the mismatch reason.
        """
        self.files += 1
        after: list[Event] = []
        newest: Any = _NO_MARKER
        for raw in iter_lines_reverse(path):
            self.scanned += 1
            if time.monotonic() > self.deadline:
                raise _BudgetSpent
            parsed = _parse_line(raw)
            if isinstance(parsed, str):
                self.skipped += 1
                continue
            if parsed["type"] == EventType.CHECKPOINT_WRITTEN:
                if newest is _NO_MARKER:
                    newest = parsed.get("checkpoint_id")
                if parsed.get("checkpoint_id") == target and self.own(parsed, target):
                    after.reverse()
                    return parsed, after, newest
                step = _as_int(parsed.get("step"))
                if self.floor_step is not None and step is not None and step < self.floor_step:
                    raise _PastTarget(parsed, newest)
            if parsed["type"] == EventType.REWOUND:
                self.rewound(parsed)
                continue
            if self.rewound_away(parsed):
                continue
            after.append(parsed)
        return None, [], newest


def scan_for_resume(
    session_dir: Path,
    checkpoint_id: str | None,
    *,
    budget_seconds: float = HydrationConstants().buffer_scan_timeout_seconds,
    exclude: Collection[Path] = (),
    checkpoint_step: int | None = None,
    incarnation: str | None = None,
) -> ScanResult:
    """Find the events written after the store's checkpoint, reading the newest session file backwards.

    Files are read newest first, each from its end back to the ``CHECKPOINT_WRITTEN`` whose ``checkpoint_id``
    equals ``checkpoint_id`` (None matches null, the marker of a fresh job); the events after it are returned.
    In the normal case that marker is the newest line of its kind, so the cost grows only with the events
    after it. Markers of newer checkpoints are read past: when the store fell back to an older checkpoint
    (CRC mismatch), the completed calls of the step it resumes are still in the journal and are replayed.
    A file without the marker (an attempt that died during hydration) is passed over for the next older one;
    when no file has it, the result is a ``marker mismatch`` (or ``no checkpoint marker``).

    When the store's checkpoint is newer than every marker (the process died between committing it and
    journaling its marker), reading past markers would read the whole history. Pass ``checkpoint_step``
    (the step the store's checkpoint was written after) to bound that: markers are written in step order,
    so the scan stops at the first marker of an earlier step, and the cost again grows only with the
    events after the newest marker. Without it, only ``budget_seconds`` bounds a mismatch.

    Synchronous and blocking: the runtime calls it on a worker thread. It never raises: a missing
    directory or file, torn or corrupt lines, a mismatch or a spent budget give ``found=False`` and a reason.

    Args:
        session_dir: the job's session directory.
        checkpoint_id: the id of the checkpoint the store returned, None for a fresh job.
        budget_seconds: wall-time budget (``AGENTLIFE_HYDRATION_BUFFER_SCAN_TIMEOUT_SECONDS``).
        exclude: files to pass over, typically the running process's own new session file.
        checkpoint_step: the step of the store's checkpoint (-1 for a fresh job), bounding a mismatch.
        incarnation: the job row's `JobRecord.incarnation`. A fresh job's marker (``checkpoint_id`` None)
            matches only one that carries the same: session files another job of the same id left
            (another store sharing the data directory, a job re-created after its tombstone expired)
            are never replayed.
    """
    started = time.monotonic()
    scan = _Scan(started + budget_seconds, started, checkpoint_step, incarnation)
    session_dir = Path(session_dir)
    fresh = checkpoint_id is None
    if not session_dir.is_dir():
        reason = f"session directory {session_dir} does not exist"
        return scan.result(False, reason, None, expected=fresh)
    skip = {Path(p) for p in exclude}
    files = [p for p in list_sessions(session_dir) if p not in skip]
    if not files:
        return scan.result(False, f"no session files in {session_dir}", None, expected=fresh)
    newest_seen: Any = _NO_MARKER
    for path in reversed(files):
        try:
            marker, after, newest = scan.scan_file(path, checkpoint_id)
        except _BudgetSpent:
            reason = f"scan budget of {budget_seconds:g} s spent after {scan.scanned} lines in {path.name}"
            return scan.result(False, reason, path)
        except _PastTarget as past:
            newest_id = newest_seen[0] if newest_seen is not _NO_MARKER else past.newest
            reason = (
                f"marker mismatch: the newest checkpoint marker is {newest_id!r}, and the store's checkpoint "
                f"{checkpoint_id!r} (step {checkpoint_step}) is not in the journal (reading back reached the "
                f"marker of step {past.marker.get('step')} in {path.name})"
            )
            # Killed between committing the checkpoint and journaling its marker: the step after it never
            # started, so there is nothing to replay.
            return scan.result(False, reason, path, expected=True)
        except OSError as exc:
            return scan.result(False, f"cannot read {path.name}: {exc}", path)
        if newest_seen is _NO_MARKER and newest is not _NO_MARKER:
            newest_seen = (newest, path)
        if marker is None:
            continue
        reason = f"found marker {checkpoint_id!r} in {path.name}: {len(after)} events after it"
        if scan.skipped:
            reason += f", {scan.skipped} corrupt lines skipped"
        return scan.result(True, reason, path, events=after, marker=marker)
    if scan.foreign:
        reason = (
            f"the session files in {session_dir} hold {scan.foreign} fresh-job marker(s) of another job of "
            "the same id (another store sharing the data directory, or a job deleted before this one was "
            "created)"
        )
        return scan.result(False, reason, files[-1])
    if newest_seen is not _NO_MARKER:
        found_id, where = newest_seen
        reason = (
            f"marker mismatch: the newest checkpoint marker in {where.name} is {found_id!r}, "
            f"and no marker of the store's checkpoint {checkpoint_id!r} was found"
        )
        return scan.result(False, reason, where)
    reason = f"no checkpoint marker in {len(files)} session file(s)"
    return scan.result(False, reason, files[0], expected=fresh)  # fresh: earlier tries died while booting


# ------------------------------------------------------------------------------------------------- replay

ToolStatus: TypeAlias = Literal["completed", "failed", "pending"]
_STEP_TYPES = frozenset(
    {
        EventType.STEP_STARTED,
        EventType.LLM_STARTED,
        EventType.LLM_COMPLETED,
        EventType.TOOL_STARTED,
        EventType.TOOL_COMPLETED,
        EventType.TOOL_FAILED,
        EventType.RETRY,
        EventType.REPLAY_DISCARDED,
        EventType.WAIT_STARTED,
        EventType.WAIT_COMPLETED,
        EventType.USAGE_COUNTED,
    }
)


@dataclass(frozen=True, slots=True)
class WaitRecord:
    """What the journal knows about one durable wait (``ctx.sleep``) of the resumed step.

    ``pending``: started (``until`` is when it ends), no outcome yet; ``completed``: ``outcome`` is what the
    wait returns on replay.
    """

    call: int
    kind: str | None
    digest: str | None
    until: float | None
    status: Literal["pending", "completed"]
    outcome: Any = None


@dataclass(frozen=True, slots=True)
class ToolRecord:
    """What the journal knows about one tool call of the resumed step.

    ``pending`` means ``TOOL_STARTED`` without a completion: the effect may or may not have happened, and
    the tool's ``verify`` (or a re-run, at-least-once) decides. A ``completed`` call with an
    ``error_class`` is one whose effect happened but whose result the journal refused (`refused`): replay
    raises that error again instead of running the tool.

    ``side_effects`` is what ``TOOL_STARTED`` said of the tool (None in journals older than the field).
    ``started`` is when the latest ``TOOL_STARTED`` was written (Unix seconds; its original time when it
    was carried forward), so a pending call's deadline can be known on any later attempt.
    """

    call: int
    invocation_id: str | None
    tool: str | None
    status: ToolStatus
    result: Any = None
    error_class: str | None = None
    error: str | None = None
    args_digest: str | None = None
    digest: str | None = None
    side_effects: bool | None = None
    started: float | None = None

    @property
    def refused(self) -> bool:
        """Whether the call completed but its result was refused by the journal (its error is recorded)."""
        return self.status == "completed" and self.error_class is not None


@dataclass(frozen=True, slots=True)
class ReplayMap:
    """Recorded outcomes of the resumed step's calls, by call number.

    Attributes:
        step: the step this map is for.
        llm: call number -> the ``LLM_COMPLETED.response`` to return instead of calling the model.
        llm_digests: call number -> the recorded request digest (absent in journals of agentlife 0.1).
        tools: call number -> `ToolRecord`.
        waits: call number -> `WaitRecord`.
        discarded: call numbers whose records a ``REPLAY_DISCARDED`` voided; a side-effecting tool with
            ``verify`` is still asked before it runs again at one of them.
        uncounted: LLM calls whose usage no commit counted yet (``usage_deferred`` and no later
            ``USAGE_COUNTED``): the step that replays them counts them with its checkpoint.
        events: the step's raw events, oldest first (see `events_for_carry_forward`).
    """

    step: int
    llm: dict[int, Any] = field(default_factory=dict)
    llm_digests: dict[int, str] = field(default_factory=dict)
    tools: dict[int, ToolRecord] = field(default_factory=dict)
    waits: dict[int, WaitRecord] = field(default_factory=dict)
    discarded: set[int] = field(default_factory=set)
    events: list[Event] = field(default_factory=list)
    uncounted: set[int] = field(default_factory=set)

    def llm_result(self, call: int) -> Any | None:
        """The recorded response of LLM call ``call``, or None when it must be issued."""
        return self.llm.get(call)

    def discard_from(self, call: int) -> None:
        """Void every record of call ``call`` and later (``replay_mismatch = "rerun"``)."""
        tables: tuple[dict[int, Any], ...] = (self.llm, self.llm_digests, self.tools, self.waits)
        for table in tables:
            for number in [n for n in table if n >= call]:
                self.discarded.add(number)
                del table[number]
        self.discarded.add(call)

    def tool(self, call: int) -> ToolRecord | None:
        """The record of tool call ``call``, or None when the journal never saw it start."""
        return self.tools.get(call)

    def recorded_other(self, call: int, kind: str) -> str | None:
        """What the journal recorded at ``call`` when it is not a call of ``kind`` (llm, tool, wait).

        A step that now makes another kind of call at a number where the journal recorded, say, a wait
        has changed: the call must not run live as if nothing had been recorded there.
        """
        if kind != "llm" and call in self.llm:
            return f"LLM ({self.llm_digests.get(call, '?')})"
        tool = self.tools.get(call)
        if kind != "tool" and tool is not None:
            return f"tool {tool.tool or '?'} ({tool.digest or tool.args_digest or '?'})"
        wait = self.waits.get(call)
        if kind != "wait" and wait is not None:
            return f"wait {wait.kind or '?'} ({wait.digest or '?'})"
        return None

    @property
    def max_call(self) -> int:
        """The highest call number recorded for the step, -1 when none."""
        return max([*self.llm, *self.tools, *self.waits], default=-1)

    @property
    def empty(self) -> bool:
        """Whether nothing can be replayed."""
        return not self.llm and not self.tools and not self.waits

    def events_for_carry_forward(self) -> list[Event]:
        """The step's raw events, for `Journal.carry_forward` into the new session file."""
        return list(self.events)


def _as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def build_replay(events: Iterable[Mapping[str, Any]], step: int) -> ReplayMap:
    """The `ReplayMap` of ``step`` from the events after the marker (`ScanResult.events`).

    Events of other steps and malformed events are ignored. For a tool call, a completion is final
    (a later start or failure cannot undo an effect that happened); otherwise the latest event decides,
    so a failure followed by a new start (a retry) is pending again. For an LLM call the latest
    ``LLM_COMPLETED`` wins.
    """
    replay = ReplayMap(step=step)
    for event in events:
        if event.get("type") not in _STEP_TYPES or _as_int(event.get("step")) != step:
            continue
        replay.events.append(dict(event))
        if event.get("type") == EventType.USAGE_COUNTED:
            calls = event.get("calls")
            replay.uncounted.difference_update(calls if isinstance(calls, list) else ())
            continue
        call = _as_int(event.get("call"))
        if call is None:
            continue
        if event.get("type") == EventType.REPLAY_DISCARDED:
            replay.discard_from(call)
            continue
        _apply(replay, event, call)
    return replay


def _apply_wait(replay: ReplayMap, event: Mapping[str, Any], call: int) -> None:
    """A wait's start records when it ends; its completion (final) records its outcome."""
    previous = replay.waits.get(call)
    if previous is not None and previous.status == "completed":
        return
    until = event.get("until")
    kind, digest = _str_or_none(event.get("kind")), _str_or_none(event.get("digest"))
    if event.get("type") == EventType.WAIT_STARTED:
        good = isinstance(until, int | float) and not isinstance(until, bool) and math.isfinite(until)
        end = float(until) if good and until is not None else None  # a torn or hand-written start: no end
        replay.waits[call] = WaitRecord(call, kind, digest, end, "pending")
        return
    started = previous.until if previous is not None else None
    replay.waits[call] = WaitRecord(call, kind, digest, started, "completed", event.get("outcome"))


def _apply(replay: ReplayMap, event: Mapping[str, Any], call: int) -> None:
    type_ = event.get("type")
    if type_ in (EventType.WAIT_STARTED, EventType.WAIT_COMPLETED):
        _apply_wait(replay, event, call)
        return
    if type_ == EventType.LLM_COMPLETED:
        replay.llm[call] = event.get("response")
        if event.get("usage_deferred") is True:
            replay.uncounted.add(call)
        else:  # written by a version that counted each call when it was made
            replay.uncounted.discard(call)
        digest = _str_or_none(event.get("digest"))
        if digest is not None:
            replay.llm_digests[call] = digest
        else:
            replay.llm_digests.pop(call, None)
        return
    if type_ not in (EventType.TOOL_STARTED, EventType.TOOL_COMPLETED, EventType.TOOL_FAILED):
        return
    previous = replay.tools.get(call)
    if previous is not None and previous.status == "completed" and not _supersedes(event, previous):
        return
    if previous is not None and type_ != EventType.TOOL_STARTED and _names_another_call(event, previous):
        _log.warning(
            "journal: a %s of call %s names another call than its start (%s); passed over",
            type_,
            call,
            previous.invocation_id or previous.tool or "?",
        )
        return
    invocation_id = event.get("invocation_id")
    tool_name = event.get("tool")
    side_effects = event.get("side_effects")
    record = ToolRecord(
        call=call,
        invocation_id=invocation_id if isinstance(invocation_id, str) else None,
        tool=tool_name if isinstance(tool_name, str) else None,
        status="pending",
        args_digest=_str_or_none(event.get("args_digest")),
        digest=_str_or_none(event.get("digest")),
        side_effects=side_effects if isinstance(side_effects, bool) else None,
        started=_event_time(event) if type_ == EventType.TOOL_STARTED else None,
    )
    if previous is not None and not _supersedes(event, previous):
        # keep what the start told us when the completion omits it
        record = ToolRecord(
            call=call,
            invocation_id=record.invocation_id or previous.invocation_id,
            tool=record.tool or previous.tool,
            status="pending",
            args_digest=record.args_digest or previous.args_digest,
            digest=record.digest or previous.digest,
            side_effects=record.side_effects if record.side_effects is not None else previous.side_effects,
            started=record.started if record.started is not None else previous.started,
        )
    if type_ == EventType.TOOL_COMPLETED:
        record = _replace_status(
            record,
            "completed",
            result=event.get("result"),
            error_class=_str_or_none(event.get("error_class")),
            error=_str_or_none(event.get("error")),
        )
    elif type_ == EventType.TOOL_FAILED:
        record = _replace_status(
            record,
            "failed",
            error_class=_str_or_none(event.get("error_class")),
            error=_str_or_none(event.get("error")),
        )
    replay.tools[call] = record


def _names_another_call(event: Mapping[str, Any], previous: ToolRecord) -> bool:
    """Whether an outcome (completion, failure) does not belong to the start recorded before it.

    Written by agentlife an outcome repeats its start's digest, tool and invocation id; one that contradicts
    them, or omits the digest its start has, was written by someone else, and never stands for the call.
    """
    digest = _str_or_none(event.get("digest"))
    if previous.digest is not None and digest != previous.digest:
        return True
    for key, known in (("tool", previous.tool), ("invocation_id", previous.invocation_id)):
        value = event.get(key)
        if known is not None and value is not None and value != known:
            return True
    return False


def _supersedes(event: Mapping[str, Any], previous: ToolRecord) -> bool:
    """A start of a *different* call at the same number (after a ``"rerun"``) replaces what was recorded."""
    digest = _str_or_none(event.get("digest"))
    return (
        event.get("type") == EventType.TOOL_STARTED
        and digest is not None
        and previous.digest is not None
        and digest != previous.digest
    )


def _event_time(event: Mapping[str, Any]) -> float | None:
    """When ``event`` was first written: its ``carried_ts`` when carried forward, else its ``ts``."""
    value = event.get("carried_ts", event.get("ts"))
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _replace_status(record: ToolRecord, status: ToolStatus, **changes: Any) -> ToolRecord:
    return replace(record, status=status, **changes)
