"""The JSONL session journal: write-ahead events, the recovery scan and the replay map.

One file per process, ``{session_dir}/session_{attempt:04d}_{unix_ms}.jsonl``; each line is one orjson object
``{"v": 1, "ts": <unix s>, "seq": <n>, "type": <EventType>, ...fields}``.

Writing (`Journal`):

- `Journal.append` serialises the event into an in-memory buffer and returns its ``seq``; it never touches
  the disk, so it costs a few microseconds of CPU on the event loop.
- `Journal.append_durable` is the write-ahead path: it returns only once the line, and everything buffered
  before it, is written and fsynced. Concurrent callers share one fsync (group commit): whoever takes the
  I/O lock writes the whole buffer and syncs it; the others find their ``seq`` already covered.
- `Journal.run_periodic_flush` hands the buffer to the kernel at least every ``interval`` seconds (sooner
  when the buffer grows past 256 KiB), so a process crash loses at most that much of the buffered events.
- All writes and fsyncs run on a worker thread (`anyio.to_thread.run_sync`); the loop never waits on disk.

Reading is tolerant: `read_events` yields `BadLine` records instead of raising, `scan_for_resume` reads
the newest file backwards to the checkpoint marker and never raises, and `build_replay` turns the events
after the marker into a `ReplayMap` for the resumed step.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
import re
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeAlias

import anyio
import anyio.to_thread
import orjson

from agentlife._config import validate_job_id
from agentlife._redact import Redactor

__all__ = [
    "FORMAT_VERSION",
    "BadLine",
    "Event",
    "EventType",
    "Journal",
    "ReplayMap",
    "ScanResult",
    "ToolRecord",
    "ToolStatus",
    "args_digest",
    "build_replay",
    "contained_session_dir",
    "iter_lines_reverse",
    "job_session_dir",
    "list_sessions",
    "read_events",
    "scan_for_resume",
    "session_path",
]

_log = logging.getLogger("agentlife.journal")

#: The ``v`` field of every line.
FORMAT_VERSION = 1

#: One parsed journal line.
Event: TypeAlias = dict[str, Any]

_SESSION_NAME = re.compile(r"^session_(\d{4,})_(\d+)\.jsonl$")
_RESERVED = frozenset({"v", "ts", "seq", "type"})
_OPTIONS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS
# Past this much buffered data the periodic flusher is woken early instead of waiting for its interval.
_WAKE_BYTES = 256 * 1024
_MAX_SANITISE_DEPTH = 64
_BAD_LINE_PREVIEW = 120


class EventType(enum.StrEnum):
    """The ``type`` of a journal line, with the fields each carries.

    ``RETRY`` and ``LLM_STARTED`` are additions to the design's list: the first journals a transient error
    that will be retried, the second lets ``journal show`` time LLM calls.
    """

    #: ``job_id, agent_id, attempt, pid`` (+ anything useful: pod, version, previous exit code).
    SESSION_STARTED = "SESSION_STARTED"
    #: ``from, to``: a lifecycle transition (state names).
    LIFECYCLE = "LIFECYCLE"
    #: ``step``.
    STEP_STARTED = "STEP_STARTED"
    #: ``step, call, model, digest``: the request is about to be sent; lets the timeline time the call.
    LLM_STARTED = "LLM_STARTED"
    #: ``step, call, response, usage, digest``: ``response`` is what replay returns for this call.
    LLM_COMPLETED = "LLM_COMPLETED"
    #: ``step, call, invocation_id, tool, args_digest, digest``: durable before a side-effecting tool runs.
    TOOL_STARTED = "TOOL_STARTED"
    #: ``step, call, invocation_id, tool, result, digest``: durable before the step goes on.
    TOOL_COMPLETED = "TOOL_COMPLETED"
    #: ``step, call, invocation_id, tool, error_class, error``.
    TOOL_FAILED = "TOOL_FAILED"
    #: ``step, checkpoint_id, crc``: the recovery scan's marker (``checkpoint_id`` null for a fresh job).
    CHECKPOINT_WRITTEN = "CHECKPOINT_WRITTEN"
    #: ``step, call, kind ("llm" | "tool"), error_class, error, delay``: a transient error, retried.
    RETRY = "RETRY"
    #: ``step, call, invocation_id, recorded, current``: a resumed step's call differed from the record
    #: and the agent chose ``replay_mismatch = "rerun"``: the step's records from ``call`` on are void.
    REPLAY_DISCARDED = "REPLAY_DISCARDED"
    #: ``reason``.
    DRAIN_STARTED = "DRAIN_STARTED"
    #: ``exit_code``.
    SESSION_ENDED = "SESSION_ENDED"


# --------------------------------------------------------------------------------------------------- paths


def session_path(session_dir: Path, attempt: int, unix_ms: int) -> Path:
    """``{session_dir}/session_{attempt:04d}_{unix_ms}.jsonl``."""
    return Path(session_dir) / f"session_{attempt:04d}_{unix_ms}.jsonl"


def job_session_dir(data_dir: Path, job_id: str) -> Path:
    """``{data_dir}/sessions/{job_id}``, refusing job ids that could leave the data directory.

    Raises:
        ConfigError: ``job_id`` does not match the allowed pattern.
    """
    return Path(data_dir) / "sessions" / validate_job_id(job_id)


def contained_session_dir(data_dir: Path, job_id: str) -> Path:
    """Create ``{data_dir}/sessions/{job_id}`` and return it, refusing to leave the data directory.

    A symlink on the way (``sessions`` or the job's directory) is followed only when it leads to a place
    inside the data directory; one leading outside is refused before anything is created through it,
    so a planted link cannot make the journal write (or the recovery scan read) somewhere else.

    Raises:
        ConfigError: ``job_id`` is not allowed, or a symlink leads outside the data directory.
        OSError: a directory cannot be created.
    """
    from agentlife._exceptions import ConfigError

    root = Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    real_root = root.resolve()
    path = root
    for part in ("sessions", validate_job_id(job_id)):
        path = path / part
        if path.is_symlink():
            target = path.resolve()
            if not target.is_relative_to(real_root):
                raise ConfigError(
                    f"{path} is a symlink to {target}, outside the data directory {real_root}: refused"
                )
        path.mkdir(exist_ok=True)
    return path


def list_sessions(session_dir: Path) -> list[Path]:
    """The session files in ``session_dir``, oldest to newest by (attempt, unix_ms).

    Files whose names do not follow the session pattern are ignored; a missing directory gives ``[]``.
    """
    try:
        entries = list(os.scandir(session_dir))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found: list[tuple[int, int, str]] = []
    for entry in entries:
        match = _SESSION_NAME.match(entry.name)
        # A session file that is a symlink is not ours: it could point anywhere.
        if match and entry.is_file(follow_symlinks=False):
            found.append((int(match.group(1)), int(match.group(2)), entry.name))
    found.sort()
    return [Path(session_dir) / name for _, _, name in found]


# ------------------------------------------------------------------------------------------- serialising


def _dumps(record: Mapping[str, Any], option: int = _OPTIONS) -> bytes:
    """Serialise with ``default=str``; what orjson still refuses (huge ints, cycles) is sanitised first."""
    try:
        return orjson.dumps(record, default=str, option=option)
    except orjson.JSONEncodeError:
        return orjson.dumps(_sanitise(record, 0), default=_safe_str, option=option)


def _safe_str(value: Any) -> str:
    try:
        return str(value)
    except Exception:  # an object whose __str__ fails must not fail the journal
        return f"<unprintable {type(value).__name__}>"


def _sanitise(value: Any, depth: int) -> Any:
    """A JSON-safe copy: oversized ints and anything too deep (or cyclic) become strings."""
    if depth > _MAX_SANITISE_DEPTH:
        return f"<nested too deep: {type(value).__name__}>"
    if isinstance(value, bool) or value is None or isinstance(value, (float, str)):
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**64 else str(value)
    if isinstance(value, Mapping):
        return {str(k): _sanitise(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_sanitise(v, depth + 1) for v in value]
    return _safe_str(value)


def args_digest(args: Mapping[str, Any]) -> str:
    """SHA-256 hex of the orjson of ``args`` with sorted keys (``TOOL_STARTED.args_digest``).

    Equal arguments give equal digests on every attempt, so a resumed step can tell that a pending call
    is the same call.
    """
    return hashlib.sha256(_dumps(args, orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)).hexdigest()


# ------------------------------------------------------------------------------------------------ writing


@dataclass(frozen=True, slots=True)
class _IoOutcome:
    written: int
    synced: bool
    error: OSError | None


def _write_all(fd: int, data: bytes) -> tuple[int, OSError | None]:
    """Write ``data``; returns how much the kernel took, and the error that stopped it.

    The count survives the error: after a short write on a full disk, what was written must not be
    written again (that would leave a corrupt line followed by a duplicated event).
    """
    view = memoryview(data)
    done = 0
    while done < len(view):
        try:
            done += os.write(fd, view[done:])
        except OSError as exc:
            return done, exc
    return done, None


def _sync(fd: int) -> None:
    # fdatasync is enough for appends: it also flushes the size change needed to read the data back.
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:  # pragma: no cover - macOS
        os.fsync(fd)


def _sync_dir(path: Path) -> None:
    """Make the new file's directory entry durable; some filesystems refuse, which only costs durability."""
    try:
        dir_fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


class Journal:
    """An append-only session file with buffered and write-ahead (durable) appends.

    Create it with `Journal.create`; run `run_periodic_flush` in the runtime's task group; close it with
    `aclose` (in a shielded, time-limited scope). Not thread-safe: use it from the event loop thread.

    Values orjson cannot serialise are written as ``str(value)`` (``default=str``), integers beyond 64 bits
    and cyclic structures as strings too, so an odd object returned by a tool never crashes the agent.
    When a `Redactor` is given, every string in the fields is redacted before it is written.

    Example:
        >>> async def demo(tmp):
        ...     journal = Journal.create(tmp, attempt=1)
        ...     journal.append(EventType.STEP_STARTED, step=0)
        ...     await journal.append_durable(EventType.TOOL_STARTED, step=0, call=0, invocation_id="j/0/0",
        ...                                  tool="kubectl_apply", args_digest=args_digest({}))
        ...     await journal.aclose()
    """

    def __init__(self, path: Path, fd: int, *, redactor: Redactor | None = None) -> None:
        self.path = path
        self._fd: int | None = fd
        self._redactor = redactor
        self._buffer: list[bytes] = []
        self._buffered_bytes = 0
        self._carry = b""  # bytes a failed write left unwritten; they go out first next time
        self._next_seq = 0
        self._written_seq = -1
        self._synced_seq = -1
        self._io_lock = anyio.Lock(fast_acquire=True)
        self._wake: anyio.Event | None = None
        self._dir_synced = False
        self._closed = False
        self._last_flush_error: str | None = None
        self.fsync_count = 0
        self.events_written = 0
        self.bytes_written = 0
        self.events_dropped = 0

    # -- creation ------------------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        session_dir: Path,
        attempt: int,
        *,
        unix_ms: int | None = None,
        redactor: Redactor | None = None,
    ) -> Journal:
        """Create ``session_dir`` if needed and a new session file in it, opened for append.

        The file is created exclusively (mode 0600: journals hold tool results); when the name is taken
        (same attempt, same millisecond) the next millisecond is tried.

        Args:
            session_dir: ``Settings.session_dir``, i.e. ``{data_dir}/sessions/{job_id}``.
            attempt: the process's attempt number (1-based).
            unix_ms: the timestamp in the file name; now by default.
            redactor: masks secrets in every string field before it is written.

        Raises:
            OSError: the directory or the file cannot be created.
        """
        session_dir = Path(session_dir)
        session_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.time_ns() // 1_000_000 if unix_ms is None else unix_ms
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        flags |= getattr(os, "O_NOFOLLOW", 0)  # O_EXCL already refuses a planted link; say so twice
        while True:
            path = session_path(session_dir, attempt, stamp)
            try:
                fd = os.open(path, flags, 0o600)
            except FileExistsError:
                stamp += 1
                continue
            return cls(path, fd, redactor=redactor)

    # -- stats -----------------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether `aclose` has finished."""
        return self._closed

    @property
    def events_appended(self) -> int:
        """Events accepted by `append` so far (the next ``seq``)."""
        return self._next_seq

    @property
    def events_buffered(self) -> int:
        """Events accepted but not yet handed to the kernel."""
        return self._next_seq - 1 - self._written_seq

    # -- appending -------------------------------------------------------------------------------------------

    def append(self, type: str, **fields: Any) -> int:
        """Buffer one event and return its ``seq``; never blocks on I/O.

        ``LIFECYCLE`` needs ``from``, a keyword: pass it as ``**{"from": a, "to": b}``.
        After `aclose` the event is dropped (counted in ``events_dropped``) rather than raising, so a late
        event in cleanup cannot crash the process.

        Raises:
            ValueError: a field is named ``v``, ``ts``, ``seq`` or ``type``.
        """
        if "seq" in fields or "ts" in fields or "v" in fields:  # ("type" cannot be passed twice)
            raise ValueError(f"journal fields may not be named {sorted(_RESERVED.intersection(fields))}")
        if self._closed:
            self.events_dropped += 1
            _log.warning("journal %s is closed; dropped a %s event", self.path.name, type)
            return -1
        if self._redactor is not None:
            fields = self._redactor.redact_obj(fields)
        seq = self._next_seq
        self._next_seq = seq + 1
        # Header and fields are dumped apart and joined instead of merged into one dict: measured faster,
        # and the joined line is a small exact-size object, cheaper to hold than orjson's output buffer.
        head = orjson.dumps(
            {"v": FORMAT_VERSION, "ts": time.time(), "seq": seq, "type": type}, default=_safe_str
        )
        if fields:
            try:
                body = orjson.dumps(fields, default=str, option=orjson.OPT_APPEND_NEWLINE)
            except orjson.JSONEncodeError:  # non-string keys, huge ints, cycles
                body = _dumps(fields)
            line = head[:-1] + b"," + body[1:]
        else:
            line = head + b"\n"
        self._buffer.append(line)
        self._buffered_bytes += len(line)
        if self._buffered_bytes >= _WAKE_BYTES and self._wake is not None:
            self._wake.set()
        return seq

    async def append_durable(self, type: str, **fields: Any) -> int:
        """Append one event and return its ``seq`` once it, and all before it, is written and fsynced.

        Concurrent callers share one fsync. If the caller is cancelled while waiting, the event stays
        buffered and goes out with the next flush.

        Raises:
            RuntimeError: the journal is closed (durability can no longer be promised).
            OSError: the write or the fsync failed; the unwritten bytes are kept for the next flush.
        """
        if self._closed:
            raise RuntimeError(f"journal {self.path.name} is closed")
        seq = self.append(type, **fields)
        while self._synced_seq < seq:
            async with self._io_lock:
                # The holder before us (a flush, another durable append, aclose) may have written and synced
                # our line along with its own.
                if self._synced_seq >= seq:
                    break
                if self._fd is None:
                    raise RuntimeError(f"journal {self.path.name} was closed before event {seq} was synced")
                await self._write_out(fsync=True)
        return seq

    def carry_forward(self, events: Iterable[Mapping[str, Any]]) -> int:
        """Re-append events read from an older session file (the resumed step's), marked ``carried``.

        Each keeps its fields; ``carried_ts`` holds its original time, so ``journal show`` and the budget
        tool are not misled by the new ``ts``. Returns how many were appended.
        """
        count = 0
        for event in events:
            type_ = event.get("type")
            if not isinstance(type_, str):
                continue
            fields = {k: v for k, v in event.items() if k not in _RESERVED and k != "carried"}
            fields["carried"] = True
            fields.setdefault("carried_ts", event.get("ts"))
            self.append(type_, **fields)
            count += 1
        return count

    # -- flushing --------------------------------------------------------------------------------------------

    async def flush(self, *, fsync: bool = True) -> None:
        """Write everything buffered to the file; with ``fsync``, also sync it to the disk.

        Raises:
            OSError: the write or the fsync failed; unwritten bytes are kept for the next flush.
        """
        if self._fd is None:
            return
        async with self._io_lock:
            await self._write_out(fsync=fsync)

    async def run_periodic_flush(self, interval: float = 1.0, *, fsync: bool = False) -> None:
        """Flush every ``interval`` seconds (sooner when 256 KiB are buffered) until cancelled or closed.

        By default the periodic flush only hands lines to the kernel: they then survive a crash or
        SIGKILL of the process. Durable events and the flushes at checkpoints and drain do the fsyncs.
        Write errors are logged (once per distinct error) and retried at the next tick, never raised.
        """
        while not self.closed:
            self._wake = anyio.Event()
            with anyio.move_on_after(interval):
                await self._wake.wait()
            self._wake = None
            if self._fd is None:  # aclose() woke us
                return
            if self._buffer or self._carry or (fsync and self._synced_seq < self._written_seq):
                await self._flush_logging_errors(fsync=fsync)

    async def _flush_logging_errors(self, *, fsync: bool) -> None:
        try:
            await self.flush(fsync=fsync)
        except OSError as exc:
            message = f"{type(exc).__name__}: {exc}"
            if message != self._last_flush_error:
                _log.warning("journal flush to %s failed: %s", self.path.name, message)
            self._last_flush_error = message
        else:
            self._last_flush_error = None

    async def _write_out(self, *, fsync: bool) -> None:
        """Write the buffer (and sync); the caller holds the I/O lock."""
        fd = self._fd
        if fd is None:
            return
        data = self._carry + b"".join(self._buffer)
        last_seq = self._next_seq - 1
        self._buffer = []
        self._buffered_bytes = 0
        self._carry = b""
        need_sync = fsync and (bool(data) or self._synced_seq < self._written_seq)
        if not data and not need_sync:
            return
        sync_dir = need_sync and not self._dir_synced
        outcome = await anyio.to_thread.run_sync(self._do_io, fd, data, need_sync, sync_dir)
        self._account(data, last_seq, outcome, sync_dir)
        if outcome.error is not None:
            raise outcome.error

    def _do_io(self, fd: int, data: bytes, sync: bool, sync_dir: bool) -> _IoOutcome:
        """Runs on a worker thread: write, then fsync; reports errors instead of raising them."""
        written, error = _write_all(fd, data) if data else (0, None)
        if error is not None:
            return _IoOutcome(written, False, error)
        try:
            if sync:
                _sync(fd)
                if sync_dir:
                    _sync_dir(self.path.parent)
        except OSError as exc:
            return _IoOutcome(written, False, exc)
        return _IoOutcome(written, sync, None)

    def _account(self, data: bytes, last_seq: int, outcome: _IoOutcome, sync_dir: bool) -> None:
        self.bytes_written += outcome.written
        self.events_written += data.count(b"\n", 0, outcome.written)
        if outcome.written < len(data):
            # Keep the rest; as we are the only writer, writing it later completes the torn line.
            self._carry = data[outcome.written :] + self._carry
            return
        if outcome.error is None:
            self._written_seq = max(self._written_seq, last_seq)
        if outcome.synced:
            self.fsync_count += 1
            self._synced_seq = self._written_seq
            self._dir_synced = self._dir_synced or sync_dir

    # -- closing ---------------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Flush, fsync and close; idempotent. Call it in a shielded, time-limited scope at cleanup."""
        async with self._io_lock:
            fd = self._fd
            if fd is None:
                return
            try:
                await self._write_out(fsync=True)
            finally:
                self._fd = None
                self._closed = True
                if self._wake is not None:
                    self._wake.set()
                os.close(fd)

    async def __aenter__(self) -> Journal:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with anyio.CancelScope(shield=True):
            await self.aclose()

    def __repr__(self) -> str:
        return (
            f"<Journal {self.path} seq={self._next_seq} written={self.events_written} "
            f"fsyncs={self.fsync_count}>"
        )


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
                if parsed.get("checkpoint_id") == target:
                    after.reverse()
                    return parsed, after, newest
                step = _as_int(parsed.get("step"))
                if self.floor_step is not None and step is not None and step < self.floor_step:
                    raise _PastTarget(parsed, newest)
            after.append(parsed)
        return None, [], newest


def scan_for_resume(
    session_dir: Path,
    checkpoint_id: str | None,
    *,
    budget_seconds: float = 5.0,
    exclude: Collection[Path] = (),
    checkpoint_step: int | None = None,
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
    """
    started = time.monotonic()
    scan = _Scan(started + budget_seconds, started, checkpoint_step)
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
    }
)


@dataclass(frozen=True, slots=True)
class ToolRecord:
    """What the journal knows about one tool call of the resumed step.

    ``pending`` means ``TOOL_STARTED`` without a completion: the effect may or may not have happened, and
    the tool's ``verify`` (or a re-run, at-least-once) decides.
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


@dataclass(frozen=True, slots=True)
class ReplayMap:
    """Recorded outcomes of the resumed step's calls, by call number.

    Attributes:
        step: the step this map is for.
        llm: call number -> the ``LLM_COMPLETED.response`` to return instead of calling the model.
        llm_digests: call number -> the recorded request digest (absent in journals of agentlife 0.1).
        tools: call number -> `ToolRecord`.
        discarded: call numbers whose records a ``REPLAY_DISCARDED`` voided; a side-effecting tool with
            ``verify`` is still asked before it runs again at one of them.
        events: the step's raw events, oldest first (see `events_for_carry_forward`).
    """

    step: int
    llm: dict[int, Any] = field(default_factory=dict)
    llm_digests: dict[int, str] = field(default_factory=dict)
    tools: dict[int, ToolRecord] = field(default_factory=dict)
    discarded: set[int] = field(default_factory=set)
    events: list[Event] = field(default_factory=list)

    def llm_result(self, call: int) -> Any | None:
        """The recorded response of LLM call ``call``, or None when it must be issued."""
        return self.llm.get(call)

    def discard_from(self, call: int) -> None:
        """Void every record of call ``call`` and later (``replay_mismatch = "rerun"``)."""
        for table in (self.llm, self.llm_digests, self.tools):
            for number in [n for n in table if n >= call]:
                self.discarded.add(number)
                del table[number]
        self.discarded.add(call)

    def tool(self, call: int) -> ToolRecord | None:
        """The record of tool call ``call``, or None when the journal never saw it start."""
        return self.tools.get(call)

    @property
    def max_call(self) -> int:
        """The highest call number recorded for the step, -1 when none."""
        return max([*self.llm, *self.tools], default=-1)

    @property
    def empty(self) -> bool:
        """Whether nothing can be replayed."""
        return not self.llm and not self.tools

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
        call = _as_int(event.get("call"))
        if call is None:
            continue
        if event.get("type") == EventType.REPLAY_DISCARDED:
            replay.discard_from(call)
            continue
        _apply(replay, event, call)
    return replay


def _apply(replay: ReplayMap, event: Mapping[str, Any], call: int) -> None:
    type_ = event.get("type")
    if type_ == EventType.LLM_COMPLETED:
        replay.llm[call] = event.get("response")
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
    invocation_id = event.get("invocation_id")
    tool_name = event.get("tool")
    record = ToolRecord(
        call=call,
        invocation_id=invocation_id if isinstance(invocation_id, str) else None,
        tool=tool_name if isinstance(tool_name, str) else None,
        status="pending",
        args_digest=_str_or_none(event.get("args_digest")),
        digest=_str_or_none(event.get("digest")),
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
        )
    if type_ == EventType.TOOL_COMPLETED:
        record = _replace_status(record, "completed", result=event.get("result"))
    elif type_ == EventType.TOOL_FAILED:
        record = _replace_status(
            record,
            "failed",
            error_class=_str_or_none(event.get("error_class")),
            error=_str_or_none(event.get("error")),
        )
    replay.tools[call] = record


def _supersedes(event: Mapping[str, Any], previous: ToolRecord) -> bool:
    """A start of a *different* call at the same number (after a ``"rerun"``) replaces what was recorded."""
    digest = _str_or_none(event.get("digest"))
    return (
        event.get("type") == EventType.TOOL_STARTED
        and digest is not None
        and previous.digest is not None
        and digest != previous.digest
    )


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _replace_status(record: ToolRecord, status: ToolStatus, **changes: Any) -> ToolRecord:
    return replace(record, status=status, **changes)
