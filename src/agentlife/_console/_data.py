"""What the console's pages show, read from the store and the journals, masked and bounded.

The reads are the ones ``job list`` and ``job show`` make (`list_jobs`, the row with its approval and
wait), plus the conversation rows the newest checkpoint covers and the session journals under
``AGENTLIFE_DATA_DIR`` when this process can read them. Everything that reaches a page goes through the
console's one `Masker` first (the ids the page's links address excepted), and everything is bounded: a
page holds at most `MAX_MESSAGES` messages of at most `MAX_TEXT` characters each and `MAX_EVENTS` journal
events per session, so a job with a huge conversation costs a page of the same size as a small one.

The list is paged by a keyset cursor: the last row's ``updated_at`` and id exactly as the store holds them
(an id another client wrote as a BLOB or as text that is not UTF-8 included, `JobRecord.key`), so every row
appears once however its id is spelled.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from agentlife._checkpoint import CheckpointDoc
from agentlife._config import JOB_ID_PATTERN
from agentlife._console._timeline import Session
from agentlife._exceptions import CheckpointCorrupt, ConfigError
from agentlife._jobs._cursor import decode_position, encode_position, position_of
from agentlife._jobs._mask import MAX_TEXT, Masker
from agentlife._jobs._view import read_job_state, show_job
from agentlife._journal._recovery import BadLine, read_events
from agentlife._journal._writer import list_sessions
from agentlife.stores import ApprovalState, JobRecord, JobStatus, OperatorStore
from agentlife.stores._base import CLAIM_STALE_AFTER_SECONDS
from agentlife.stores._childjobs import JobFamily
from agentlife.stores._jobs import is_crash

__all__ = [
    "MAX_EVENTS",
    "MAX_MESSAGES",
    "MAX_TEXT",
    "BadRequest",
    "Cursors",
    "JobView",
    "ListQuery",
    "ListResult",
    "ListedJob",
    "journal_dir",
    "list_jobs",
    "load_job",
    "parse_list_query",
    "row_version",
]

#: Rows on one page of the jobs list.
PAGE_SIZE = 50
#: The longest job or agent id a request may name (ids written by other tools may exceed the pattern).
MAX_ID = 512
#: The most characters of an id or agent id the list holds (the cell shows fewer, its title all of these).
LISTED_ID = 4096
#: The most conversation messages one page shows.
MAX_MESSAGES = 200
#: The most journal events read from one session file, and the newest sessions read.
MAX_EVENTS = 3000
MAX_SESSIONS = 20
#: The longest cursor put in a link (the query string holds 4096 characters); a longer one is kept here.
CURSOR_INLINE = 2048
#: How many of those long cursors are kept (the oldest is forgotten: its link then asks to start again).
CURSORS_KEPT = 256
#: The statuses a process holds the job in: an open session of such a job with a fresh heartbeat is alive.
_HELD = frozenset({JobStatus.RUNNING, JobStatus.WAITING_FOR_APPROVAL})
#: A heartbeat this far in the future (another host's clock) still counts as fresh.
_SKEW_SECONDS = 5.0


class BadRequest(ValueError):
    """A request the console refuses with 400: the message says what was wrong, in one line."""


@dataclass(frozen=True, slots=True)
class ListQuery:
    """One page of the jobs list: its filters and where it starts (the store's ``after`` cursor)."""

    status: str | None = None
    agent: str | None = None
    job_id: str | None = None
    after: tuple[Any, Any] | None = None


@dataclass(frozen=True, slots=True)
class ListedJob:
    """One row of the jobs list: ``key`` is the id its link addresses, everything else is masked."""

    key: Any
    id: str
    agent_id: str
    status: str
    attempt: Any
    updated_at: Any
    cost_usd: Any
    tokens_in: Any
    tokens_out: Any
    crashes: int


@dataclass(frozen=True, slots=True)
class ListResult:
    """The rows of a page and the cursor of the next one (None on the last page)."""

    rows: list[ListedJob]
    next_cursor: str | None


def parse_list_query(query: Mapping[str, str], cursors: Cursors) -> ListQuery:
    """The list's filters from a query string; `BadRequest` for anything that is not one."""
    status = query.get("status") or None
    if status is not None and status not in {str(s) for s in JobStatus}:
        raise BadRequest("status must be one of " + ", ".join(str(s) for s in JobStatus))
    agent = _id(query.get("agent") or None, "agent")
    job_id = _id((query.get("id") or "").strip() or None, "id")
    cursor = query.get("after") or None
    return ListQuery(status, agent, job_id, cursors.decode(cursor) if cursor else None)


def _id(value: str | None, what: str) -> str | None:
    if value is not None and (len(value) > MAX_ID or "\x00" in value):
        raise BadRequest(f"{what} must be at most {MAX_ID} characters, without NUL")
    return value


# -- the paging cursor --------------------------------------------------------------------------------------


class Cursors:
    """The list's paging cursors as URL-safe text: the last row's ``(updated_at, key)`` as stored.

    Each value keeps its type (a number, ``inf``, text, text that is not UTF-8, bytes, NULL), since the
    store compares it as it orders its rows. A cursor longer than `CURSOR_INLINE` (a row whose id runs to
    kilobytes) would not fit in a link: it is kept here, under a random name, for the `CURSORS_KEPT` newest.
    """

    def __init__(self) -> None:
        self._kept: OrderedDict[str, tuple[Any, Any]] = OrderedDict()

    def encode(self, row: JobRecord) -> str:
        """The cursor of the page that follows ``row``."""
        position = position_of(row)
        text = encode_position(position)
        if len(text) <= CURSOR_INLINE:
            return text
        name = "~" + secrets.token_urlsafe(16)
        self._kept[name] = position
        while len(self._kept) > CURSORS_KEPT:
            self._kept.popitem(last=False)
        return name

    def decode(self, text: str) -> tuple[Any, Any]:
        """The position a cursor made by `encode` names; `BadRequest` for anything else."""
        if text.startswith("~"):
            kept = self._kept.get(text)
            if kept is None:
                raise BadRequest(
                    "this paging link has expired (the console restarted): start from the newest"
                )
            return kept
        try:
            return decode_position(text)
        except ValueError:
            raise BadRequest("the paging cursor is not one this console made") from None


async def list_jobs(store: OperatorStore, query: ListQuery, masker: Masker, cursors: Cursors) -> ListResult:
    """One page of rows, newest first; the search by id is one key lookup."""
    if query.job_id is not None:
        row = await store.get_job(query.job_id)
        return ListResult([listed(row, masker)] if row is not None else [], None)
    try:
        rows = await store.list_jobs(query.status, query.agent, PAGE_SIZE + 1, after=query.after)
    except ValueError:  # a cursor of another store (bytes, NUL or a non-number on PostgreSQL)
        raise BadRequest("the paging cursor is not one of this store") from None
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    cursor = cursors.encode(rows[-1]) if more and rows else None
    return ListResult([listed(row, masker) for row in rows], cursor)


def listed(row: JobRecord, masker: Masker) -> ListedJob:
    """What the list shows of ``row``, masked (the payload and result are not read)."""
    used = row.tokens_consumed if isinstance(row.tokens_consumed, dict) else {}
    return ListedJob(
        key=row.id,
        id=masker.text(row.id, LISTED_ID),
        agent_id=masker.text(row.agent_id, LISTED_ID),
        status=masker.text(row.status, 100),
        attempt=row.attempt,
        updated_at=row.updated_at,
        cost_usd=masker.value(used.get("cost_usd"), 100),
        tokens_in=masker.value(used.get("input"), 100),
        tokens_out=masker.value(used.get("output"), 100),
        crashes=sum(1 for entry in row.error if is_crash(entry)),
    )


def row_version(row: JobRecord) -> str:
    """A digest that changes whenever the job's page would: the live script reloads the page when it does.

    A digest, not the fields: the checkpoint id is text another client may have written.
    """
    text = repr((row.status, row.attempt, row.updated_at, row.checkpoint_id))
    return hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()[:16]


# -- one job -------------------------------------------------------------------------------------------


@dataclass(slots=True)
class JobView:
    """Everything the job page shows, masked; ``key`` and ``call`` are what its links and forms address."""

    key: str
    row: JobRecord
    version: str
    history: list[str]
    history_total: int
    waits_for: list[str]
    request: dict[str, Any] | None
    call: str | None = None
    live: str | None = None
    messages: list[Any] = field(default_factory=list)
    message_total: int = 0
    conversation_note: str | None = None
    sessions: list[Session] = field(default_factory=list)
    journal_note: str | None = None
    family: JobFamily | None = None


async def load_job(
    store: OperatorStore, job_id: str, data_dir: Path, masker: Masker, now: float
) -> JobView | None:
    """The job's page, or None when the store has no such row."""
    state = await read_job_state(store, job_id)
    if state is None:
        return None
    raw, shown = state.row, show_job(state, masker)
    call = _parked_call(state.approval) if shown.request is not None else None
    view = JobView(
        key=raw.id,
        row=shown.row,
        version=row_version(raw),
        history=shown.history,
        history_total=len(raw.error),
        waits_for=shown.waits_for,
        request=shown.request,
        call=call,
        live=_alive(raw, now),
    )
    view.family = await store.get_family(job_id)
    await _conversation(store, view, masker)
    _journal(view, data_dir, masker)
    return view


def _parked_call(approval: ApprovalState | None) -> str | None:
    """The invocation id the approve form sends back: the one the store holds, unmasked, as it must match."""
    call = approval.request.get("invocation_id") if approval is not None and approval.request else None
    return call if isinstance(call, str) else None


def _alive(row: JobRecord, now: float) -> str | None:
    """What holds the job now, when a process does (its heartbeat is fresh): its open session is no crash."""
    beat = row.heartbeat_at
    if row.status not in _HELD or not isinstance(beat, (int, float)) or isinstance(beat, bool):
        return None
    age = now - beat
    if not -_SKEW_SECONDS <= age <= CLAIM_STALE_AFTER_SECONDS:  # as old as the reaper's and claim's limit
        return None
    doing = "parked on an approval" if row.status == JobStatus.WAITING_FOR_APPROVAL else "running"
    return f"{doing}, alive (heartbeat {max(age, 0.0):.0f} s ago)"


async def _conversation(store: OperatorStore, view: JobView, masker: Masker) -> None:
    """The messages the newest checkpoint covers (the first `MAX_MESSAGES` of them)."""
    job_id = view.key
    try:
        loaded = await store.load_checkpoint(job_id)
        if loaded is None:
            return
        meta = CheckpointDoc.decode(loaded.data, job_id).conversation
    except CheckpointCorrupt as exc:
        view.conversation_note = f"conversation unreadable: {masker.text(str(exc))}"
        return
    if not meta:
        return
    view.message_total = int(meta["length"])
    rows = await store.load_conversation(job_id, min(view.message_total, MAX_MESSAGES))
    for seq, raw in enumerate(rows):
        try:
            message: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            message = {"role": "?", "content": f"(message {seq} is not JSON: unreadable row)"}
        view.messages.append(masker.value(message))
    if view.message_total > len(rows):
        view.conversation_note = f"showing the first {len(rows)} of {view.message_total} messages"


def journal_dir(data_dir: Path, job_id: str) -> Path | None:
    """The job's journal directory under ``data_dir``, or None when it is not one of this disk's own.

    A directory that is a symlink, or that resolves anywhere but directly under ``data_dir``'s
    ``sessions`` (a link put there by hand to another disk), is not: the console reads only its own data
    directory (which may itself be reached through a link the operator made).
    """
    sessions = data_dir / "sessions"
    directory = sessions / job_id
    try:
        if directory.is_symlink() or directory.resolve().parent != sessions.resolve():
            return None
    except (OSError, RuntimeError):  # a loop of links, a name the filesystem refuses
        return None
    return directory


def _journal(view: JobView, data_dir: Path, masker: Masker) -> None:
    """The newest `MAX_SESSIONS` session journals of the job, when its id can name a directory."""
    job_id = view.key
    if not JOB_ID_PATTERN.fullmatch(job_id) or job_id in (".", ".."):
        view.journal_note = "no journal: this job id cannot name a journal directory"
        return
    directory = journal_dir(data_dir, job_id)
    if directory is None:
        view.journal_note = "no journal: the job's journal directory is a link out of the console's disk"
        return
    paths = list_sessions(directory)
    if not paths:
        view.journal_note = "no journal readable by the console here (the row's history is shown instead)"
        return
    for path in paths[-MAX_SESSIONS:]:
        try:
            view.sessions.append(_read_session(path, masker))
        except (OSError, ConfigError) as exc:
            why = masker.text(getattr(exc, "strerror", None) or str(exc), 500)
            view.journal_note = f"cannot read {path.name}: {why}"


def _read_session(path: Path, masker: Masker) -> Session:
    session = Session(path.name, [])
    for item in read_events(path):
        if isinstance(item, BadLine):
            session.bad_lines += 1
            continue
        if len(session.events) >= MAX_EVENTS:
            session.truncated = True
            break
        event = masker.value(item)
        if isinstance(event, dict):
            session.events.append(event)
    return session
