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
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeAlias

import anyio
import anyio.to_thread
import orjson

from agentlife._config import validate_job_id
from agentlife._exceptions import ConfigError, describe_error
from agentlife._redact import Redactor
from agentlife._replay import utf8_safe

__all__ = [
    "FORMAT_VERSION",
    "Event",
    "EventType",
    "Journal",
    "args_digest",
    "contained_session_dir",
    "job_session_dir",
    "list_sessions",
    "session_of",
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


class EventType(enum.StrEnum):
    """The ``type`` of a journal line, with the fields each carries.

    ``RETRY``, ``LLM_STARTED`` and ``TOOL_REFUSED`` are additions to the design's list: the first journals
    a transient error that will be retried, the second lets ``journal show`` time LLM calls, the third
    records a tool call of the model's that never reached a function.
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
    #: ``step, call, invocation_id, tool, args_digest, digest, side_effects``: durable before a
    #: side-effecting tool runs.
    TOOL_STARTED = "TOOL_STARTED"
    #: ``step, call, invocation_id, tool, result, digest``: durable before the step goes on. A result the
    #: journal refused (the effect happened) is ``result: null`` with ``error_class, error``.
    TOOL_COMPLETED = "TOOL_COMPLETED"
    #: ``step, call, invocation_id, tool, error_class, error``.
    TOOL_FAILED = "TOOL_FAILED"
    #: ``step, call, invocation_id, kind, digest, until``: durable before a wait (``ctx.sleep``) begins;
    #: ``until`` (unix time) is when it ends, so a resumed step waits only for what is left.
    WAIT_STARTED = "WAIT_STARTED"
    #: ``step, call, invocation_id, kind, digest, outcome``: the wait's outcome, what replay returns.
    WAIT_COMPLETED = "WAIT_COMPLETED"
    #: ``step, until``: the step ended at a wait; the row is WAITING until ``until`` (unix time).
    WAIT_PARKED = "WAIT_PARKED"
    #: ``step``: an operator's ``job pause`` stopped the job before ``step``; the row is PAUSED.
    JOB_PAUSED = "JOB_PAUSED"
    #: ``step, checkpoint_id, crc``: the recovery scan's marker (``checkpoint_id`` null for a fresh job).
    CHECKPOINT_WRITTEN = "CHECKPOINT_WRITTEN"
    #: ``step, call, kind ("llm" | "tool"), error_class, error, delay``: a transient error, retried.
    RETRY = "RETRY"
    #: ``step, call, invocation_id, recorded, current``: a resumed step's call differed from the record
    #: and the agent chose ``replay_mismatch = "rerun"``: the step's records from ``call`` on are void.
    REPLAY_DISCARDED = "REPLAY_DISCARDED"
    #: ``step, tool, tool_use_id, reason, error``: a ``tool_use`` of the model's that was not run (an
    #: unknown tool, invalid or unusable arguments, a refused final answer); the model got ``error`` back.
    TOOL_REFUSED = "TOOL_REFUSED"
    #: ``step, calls``: the usage of these LLM calls of the step was added to ``tokens_consumed`` outside a
    #: checkpoint (the step crashed, parked or was cut off); the attempt that replays them does not count
    #: them again. An ``LLM_COMPLETED`` with ``usage_deferred`` is otherwise counted by its step's checkpoint.
    USAGE_COUNTED = "USAGE_COUNTED"
    #: ``to_step, checkpoint_id, actor, reason, at``: an operator rewound the job to the checkpoint it had
    #: after ``to_step`` (``job rewind``); written first by each session that resumes from that checkpoint.
    #: The recovery scan ignores every event before it of a step after ``to_step``.
    REWOUND = "REWOUND"
    #: ``reason``.
    DRAIN_STARTED = "DRAIN_STARTED"
    #: ``exit_code``.
    SESSION_ENDED = "SESSION_ENDED"


# --------------------------------------------------------------------------------------------------- paths


def session_path(session_dir: Path, attempt: int, unix_ms: int) -> Path:
    """``{session_dir}/session_{attempt:04d}_{unix_ms}.jsonl``."""
    return Path(session_dir) / f"session_{attempt:04d}_{unix_ms}.jsonl"


def session_of(path: Path) -> tuple[int, int] | None:
    """``(attempt, unix_ms)`` from a session file's name, or None when it is not one."""
    match = _SESSION_NAME.match(Path(path).name)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


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


def _dumps(
    record: Mapping[str, Any], option: int = _OPTIONS, stringify: Callable[[Any], str] | None = None
) -> bytes:
    """Serialise with ``default=stringify`` (``str``); what orjson still refuses is sanitised first.

    That is huge ints, cycles, nesting orjson refuses and strings with lone surrogates: the line is then
    written with a stand-in, never refused. Results that replay returns are checked before they get here
    (`check_replayable`), so a stand-in only ever lands in a field that nothing replays.
    """
    stringify = stringify or _safe_str
    try:
        return orjson.dumps(record, default=stringify, option=option)
    except orjson.JSONEncodeError:
        return orjson.dumps(_sanitise(record, 0, stringify), default=stringify, option=option)


def _safe_str(value: Any) -> str:
    try:
        return str(value)
    except Exception:  # an object whose __str__ fails must not fail the journal
        return f"<unprintable {type(value).__name__}>"


def _sanitise(value: Any, depth: int, stringify: Callable[[Any], str]) -> Any:
    """A JSON-safe copy: oversized ints, lone surrogates and anything too deep (or cyclic) become strings."""
    if depth > _MAX_SANITISE_DEPTH:
        return f"<nested too deep: {type(value).__name__}>"
    if isinstance(value, str):
        return utf8_safe(value)
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**64 else str(value)
    if isinstance(value, Mapping):
        return {utf8_safe(stringify(k)): _sanitise(v, depth + 1, stringify) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_sanitise(v, depth + 1, stringify) for v in value]
    return utf8_safe(stringify(value))


def args_digest(args: Mapping[str, Any]) -> str:
    """SHA-256 hex of the orjson of ``args`` with sorted keys (``TOOL_STARTED.args_digest``).

    Equal arguments give equal digests on every attempt, so a resumed step can tell that a pending call
    is the same call.
    """
    import hashlib  # at the first tool call, not at boot: OpenSSL's start-up costs about 2 ms

    return hashlib.sha256(_dumps(args, orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)).hexdigest()


# ------------------------------------------------------------------------------------------------ writing


@dataclass(frozen=True, slots=True)
class _IoOutcome:
    written: int
    synced: bool
    error: OSError | None


def _write_all(fd: int, data: bytes | bytearray) -> tuple[int, OSError | None]:
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
        # What orjson cannot write is written as its str(), masked like every other string.
        self._stringify: Callable[[Any], str] = (
            _safe_str if redactor is None else lambda value: redactor.redact(_safe_str(value))
        )
        # One growing bytearray, not a list of lines: each line is copied in and orjson's output freed at
        # once. Holding orjson's outputs themselves measured 3-5x slower per event (their allocations
        # stay live until the flush), and a list of exact-size copies costs a join at the flush.
        self._buffer = bytearray()
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
        return self.append_line(type, **fields)[0]

    def append_line(self, type: str, **fields: Any) -> tuple[int, bytes]:
        """`append`, also returning the line as written (masked, without its newline; empty when dropped)."""
        if "seq" in fields or "ts" in fields or "v" in fields:  # ("type" cannot be passed twice)
            raise ValueError(f"journal fields may not be named {sorted(_RESERVED.intersection(fields))}")
        if self._closed:
            self.events_dropped += 1
            _log.warning("journal %s is closed; dropped a %s event", self.path.name, type)
            return -1, b""
        if self._redactor is not None:
            fields = self._redactor.redact_obj(fields)
        seq = self._next_seq
        self._next_seq = seq + 1
        # One dict, one orjson call (two calls and a join measured slower); the header keys come first.
        record = {"v": FORMAT_VERSION, "ts": time.time(), "seq": seq, "type": type, **fields}
        try:
            line = orjson.dumps(record, default=self._stringify, option=orjson.OPT_APPEND_NEWLINE)
        except orjson.JSONEncodeError:  # non-string keys, huge ints, cycles, an unprintable type
            line = _dumps(record, stringify=self._stringify)
        buffer = self._buffer
        buffer += line
        if len(buffer) >= _WAKE_BYTES and self._wake is not None:
            self._wake.set()
        return seq, line[:-1]

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
        await self.sync_through(seq)
        return seq

    async def sync_through(self, seq: int) -> None:
        """Return once event ``seq``, and all before it, is written and fsynced (a shared fsync).

        Raises:
            RuntimeError: the journal was closed before the event was synced.
            OSError: the write or the fsync failed; the unwritten bytes are kept for the next flush.
        """
        while self._synced_seq < seq:
            async with self._io_lock:
                # The holder before us (a flush, another durable append, aclose) may have written and synced
                # our line along with its own.
                if self._synced_seq >= seq:
                    break
                if self._fd is None:
                    raise RuntimeError(f"journal {self.path.name} was closed before event {seq} was synced")
                await self._write_out(fsync=True)

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
            message = describe_error(exc)
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
        # The buffer is handed over whole and replaced, so nothing appends to it while the thread writes it.
        data: bytes | bytearray = self._buffer
        if self._carry:
            data = self._carry + data
        last_seq = self._next_seq - 1
        self._buffer = bytearray()
        self._carry = b""
        need_sync = fsync and (bool(data) or self._synced_seq < self._written_seq)
        if not data and not need_sync:
            return
        sync_dir = need_sync and not self._dir_synced
        # Shielded: the buffer was handed over, so a cancellation delivered while the thread writes must
        # not lose what it wrote or failed to write (a drain cancels the periodic flusher at any moment).
        with anyio.CancelScope(shield=True):
            outcome = await anyio.to_thread.run_sync(self._do_io, fd, data, need_sync, sync_dir)
        self._account(data, last_seq, outcome, sync_dir)
        if outcome.error is not None:
            raise outcome.error

    def _do_io(self, fd: int, data: bytes | bytearray, sync: bool, sync_dir: bool) -> _IoOutcome:
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

    def _account(self, data: bytes | bytearray, last_seq: int, outcome: _IoOutcome, sync_dir: bool) -> None:
        self.bytes_written += outcome.written
        self.events_written += data.count(b"\n", 0, outcome.written)
        if outcome.written < len(data):
            # Keep the rest; as we are the only writer, writing it later completes the torn line.
            self._carry = bytes(data[outcome.written :]) + self._carry
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
