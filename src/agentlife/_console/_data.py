"""What the console's pages show, read from the store and the journals, bounded and redacted.

The reads are the ones ``job list`` and ``job show`` make (`list_jobs`, the row with its approval and
wait), plus the conversation rows the newest checkpoint covers and the session journals under
``AGENTLIFE_DATA_DIR`` when this process can read them. Everything that reaches a page goes through the
`Redactor` first, and everything is bounded: a page holds at most `MAX_MESSAGES` messages of at most
`MAX_TEXT` characters each and `MAX_EVENTS` journal events per session, so a job with a huge
conversation costs a page of the same size as a small one.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from agentlife._checkpoint import CheckpointDoc
from agentlife._cli._job import _approval_lines, _history_line, _kept_lines, _row_and_approval, _wait_lines
from agentlife._config import JOB_ID_PATTERN
from agentlife._console._timeline import Session
from agentlife._exceptions import CheckpointCorrupt, ConfigError
from agentlife._journal._recovery import BadLine, read_events
from agentlife._journal._writer import list_sessions
from agentlife._redact import MASK, Redactor
from agentlife.stores import ApprovalState, CheckpointStore, JobRecord, JobStatus, WaitState

__all__ = [
    "MAX_EVENTS",
    "MAX_MESSAGES",
    "MAX_TEXT",
    "BadRequest",
    "JobView",
    "ListQuery",
    "ListResult",
    "decode_cursor",
    "encode_cursor",
    "list_jobs",
    "load_job",
    "parse_list_query",
]

#: Rows on one page of the jobs list.
PAGE_SIZE = 50
#: The longest job or agent id a request may name (ids written by other tools may exceed the pattern).
MAX_ID = 512
#: The most conversation messages one page shows.
MAX_MESSAGES = 200
#: The most characters of one value (a message's text, a tool's input, a payload) a page shows.
MAX_TEXT = 20_000
#: The most journal events read from one session file, and the newest sessions read.
MAX_EVENTS = 3000
MAX_SESSIONS = 20
_CURSOR_MAX = 1200
# A value under a key named like a credential is masked whole on a page, whatever it looks like: the
# redactor knows secret values and shapes, not a password typed into a payload by a user.
_SECRET_KEY = re.compile(
    r"password|passwd|secret|apikey|accesskey|privatekey|authorization|credential|token(?!s)"
)


class BadRequest(ValueError):
    """A request the console refuses with 400: the message says what was wrong, in one line."""


@dataclass(frozen=True, slots=True)
class ListQuery:
    """One page of the jobs list: its filters and where it starts."""

    status: str | None = None
    agent: str | None = None
    job_id: str | None = None
    after: tuple[float, str] | None = None


@dataclass(frozen=True, slots=True)
class ListResult:
    """The rows of a page and the cursor of the next one (None on the last page)."""

    rows: list[JobRecord]
    next_cursor: str | None


def parse_list_query(query: Mapping[str, str]) -> ListQuery:
    """The list's filters from a query string; `BadRequest` for anything that is not one."""
    status = query.get("status") or None
    if status is not None and status not in {str(s) for s in JobStatus}:
        raise BadRequest("status must be one of " + ", ".join(str(s) for s in JobStatus))
    agent = _id(query.get("agent") or None, "agent")
    job_id = _id((query.get("id") or "").strip() or None, "id")
    cursor = query.get("after") or None
    return ListQuery(status, agent, job_id, decode_cursor(cursor) if cursor else None)


def _id(value: str | None, what: str) -> str | None:
    if value is not None and (len(value) > MAX_ID or "\x00" in value):
        raise BadRequest(f"{what} must be at most {MAX_ID} characters, without NUL")
    return value


def encode_cursor(row: JobRecord) -> str:
    """The cursor of the page that follows ``row``: its (updated_at, id), as URL-safe text."""
    raw = orjson.dumps([row.updated_at, row.id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str) -> tuple[float, str]:
    """The (updated_at, id) of a cursor made by `encode_cursor`; `BadRequest` for anything else."""
    if len(text) > _CURSOR_MAX:
        raise BadRequest("the paging cursor is too long")
    try:
        value = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, orjson.JSONDecodeError, ValueError):
        raise BadRequest("the paging cursor is not one this console made") from None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not isinstance(value[0], (int, float))
        or isinstance(value[0], bool)
        or not math.isfinite(value[0])
        or not isinstance(value[1], str)
        or len(value[1]) > MAX_ID
    ):
        raise BadRequest("the paging cursor is not one this console made")
    return float(value[0]), value[1]


async def list_jobs(store: CheckpointStore, query: ListQuery) -> ListResult:
    """One page of rows, newest first; the search by id is one key lookup."""
    if query.job_id is not None:
        row = await store.get_job(query.job_id)
        return ListResult([row] if row is not None else [], None)
    rows = await store.list_jobs(query.status, query.agent, PAGE_SIZE + 1, after=query.after)
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    last = rows[-1] if rows else None
    return ListResult(rows, encode_cursor(last) if more and last and last.updated_at is not None else None)


# -- one job -------------------------------------------------------------------------------------------


@dataclass(slots=True)
class JobView:
    """Everything the job page shows, redacted."""

    row: JobRecord
    approval: ApprovalState | None
    wait: WaitState | None
    payload: Any
    result: Any
    history: list[str]
    waits_for: list[str]
    request: dict[str, Any] | None
    messages: list[Any] = field(default_factory=list)
    message_total: int = 0
    conversation_note: str | None = None
    sessions: list[Session] = field(default_factory=list)
    journal_note: str | None = None


async def load_job(store: CheckpointStore, job_id: str, data_dir: Path, redactor: Redactor) -> JobView | None:
    """The job's page, or None when the store has no such row."""
    row, approval, wait, kept = await _row_and_approval(store, job_id)
    if row is None:
        return None
    request = None
    if approval is not None and approval.request is not None and row.status == JobStatus.WAITING_FOR_APPROVAL:
        request = redactor.redact_obj(dict(approval.request))
    view = JobView(
        row=row,
        approval=approval,
        wait=wait,
        payload=bound(redactor.redact_obj(row.payload)),
        result=bound(redactor.redact_obj(row.result)),
        history=[redactor.redact(_history_line(entry)) for entry in row.error[-200:]],
        waits_for=[
            redactor.redact(line.strip())
            for line in _approval_lines(approval) + _wait_lines(wait) + _kept_lines(kept)
        ],
        request=request,
    )
    await _conversation(store, view, redactor)
    _journal(view, data_dir, redactor)
    return view


async def _conversation(store: CheckpointStore, view: JobView, redactor: Redactor) -> None:
    """The messages the newest checkpoint covers (the first `MAX_MESSAGES` of them)."""
    job_id = view.row.id
    try:
        loaded = await store.load_checkpoint(job_id)
        if loaded is None:
            return
        meta = CheckpointDoc.decode(loaded.data, job_id).conversation
    except CheckpointCorrupt as exc:
        view.conversation_note = f"conversation unreadable: {redactor.redact(str(exc))}"
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
        view.messages.append(bound(redactor.redact_obj(message)))
    if view.message_total > len(rows):
        view.conversation_note = f"showing the first {len(rows)} of {view.message_total} messages"


def _journal(view: JobView, data_dir: Path, redactor: Redactor) -> None:
    """The newest `MAX_SESSIONS` session journals of the job, when its id can name a directory."""
    job_id = view.row.id
    if not JOB_ID_PATTERN.fullmatch(job_id) or job_id in (".", ".."):
        view.journal_note = "no journal: this job id cannot name a journal directory"
        return
    directory = data_dir / "sessions" / job_id
    paths = list_sessions(directory)
    if not paths:
        view.journal_note = "no journal readable by the console here (the row's history is shown instead)"
        return
    for path in paths[-MAX_SESSIONS:]:
        try:
            view.sessions.append(_read_session(path, redactor))
        except (OSError, ConfigError) as exc:
            view.journal_note = f"cannot read {path.name}: {getattr(exc, 'strerror', None) or exc}"


def _read_session(path: Path, redactor: Redactor) -> Session:
    session = Session(path.name, [])
    for item in read_events(path):
        if isinstance(item, BadLine):
            session.bad_lines += 1
            continue
        if len(session.events) >= MAX_EVENTS:
            session.truncated = True
            break
        session.events.append(redactor.redact_obj(item))
    return session


def _secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search("".join(c for c in key.lower()[:200] if c.isalnum())))


def bound(value: Any, limit: int = MAX_TEXT) -> Any:
    """``value`` with every string cut to ``limit`` characters and at most ``limit`` items per container.

    The value of a key named like a credential (``password``, ``api_key``, ``token`` ...) becomes ``***``.

    A page shows what a value holds, not all of it: a 10 MB result would otherwise be a 10 MB page.
    """
    budget = [limit * 4]

    def walk(item: Any, depth: int) -> Any:
        if budget[0] <= 0:
            return "…"
        if isinstance(item, str):
            budget[0] -= min(len(item), limit)
            return item if len(item) <= limit else item[:limit] + f"… ({len(item) - limit} more characters)"
        if depth > 40 and isinstance(item, (dict, list)):
            return f"<nested deeper than 40 levels: {type(item).__name__}>"
        if isinstance(item, dict):
            budget[0] -= len(item)
            return {
                str(k)[:200]: MASK if _secret_key(str(k)) and v not in (None, "") else walk(v, depth + 1)
                for k, v in list(item.items())[:limit]
            }
        if isinstance(item, list):
            budget[0] -= len(item)
            return [walk(v, depth + 1) for v in item[:limit]]
        return item

    return walk(value, 0)
