"""The console's HTML: every page is the shipped ``templates/base.html`` around a body built here.

What a page shows comes masked (`agentlife._jobs._mask.Masker`): this module never sees a raw row. Every
value is escaped by `esc` where it enters the markup, and nothing else builds markup from data; the only
script is the shipped ``static/console.js`` (the CSP forbids inline script), so a job id, payload or
message holding ``<script>`` is text on the page, never code. A long id is cut in the list (the whole of
it in the cell's title), so one row cannot squeeze the other columns to a letter each.
"""

from __future__ import annotations

import math
import string
import time
from collections.abc import Callable, Mapping
from functools import cache
from html import escape
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import orjson

from agentlife._budget import format_usd
from agentlife._console._batchpage import batch_form
from agentlife._console._data import JobView, ListedJob, ListQuery, ListResult
from agentlife._console._render_ops import approval_section, family_section, journal_section, overview_main
from agentlife._console._timeline import Mark, Span, Timeline, render_svg
from agentlife._jobs._pause import DEFAULT_PAUSE_REASON
from agentlife.stores import JobRecord, JobStatus
from agentlife.stores._jobs import CANCELLABLE, PAUSABLE, RETRYABLE, TERMINAL
from agentlife.stores._overview import Overview

__all__ = ["FLASHES", "error_page", "esc", "job_page", "list_page", "overview_page", "plain_page"]

#: What the page says after the store recorded an action (the server signs which, see ``_server``).
FLASHES = {
    "approve": "Approved: the job goes on.",
    "reject": "Rejected: the job ended FAILED.",
    "cancel": "Cancelled: the job ended FAILED (a process still running it is fenced out).",
    "retry": "The job will run again.",
    "pause": "Paused (a running job stops at its next step boundary).",
    "resume": "Resumed: the job is back where it was paused.",
}
#: The most characters of an id or an agent id the list shows in its cell (the title holds the rest).
LIST_CELL = 64


def esc(value: Any) -> str:
    """``value`` as HTML text (quotes too, so it is safe inside an attribute)."""
    return escape(value if isinstance(value, str) else str(value), quote=True)


@cache
def _template() -> string.Template:
    text = resources.files("agentlife._console").joinpath("templates/base.html").read_text(encoding="utf-8")
    return string.Template(text)


def _page(title: str, main: str, *, actions: bool, live: str = "") -> str:
    mode = "actions allowed" if actions else "read-only"
    return _template().substitute(title=esc(title), main=main, mode=mode, live=live)


def plain_page(title: str, main: str, *, actions: bool) -> str:
    """A page of ``main`` (markup whose every value is escaped already) in the console's frame."""
    return _page(title, main, actions=actions)


def error_page(status: int, title: str, message: str, *, actions: bool = False) -> str:
    """A page that says what went wrong in one sentence (the message is escaped)."""
    main = f'<h1>{esc(status)} {esc(title)}</h1><p class="error" role="alert">{esc(message)}</p>'
    main += '<p><a href="/">Back to the jobs</a></p>'
    return _page(f"{status} {title}", main, actions=actions)


# -- the jobs list ---------------------------------------------------------------------------------------


def list_page(
    query: ListQuery, result: ListResult, *, actions: bool, now: float, mask: Callable[[str], str] = str
) -> str:
    """The jobs list with its filter form and the link to the next page.

    ``mask``: what the filter's own values are shown through where the page echoes them (a value typed
    into the filter is as likely to be a secret as one read from the store); its links keep them as given.
    """
    parts = ["<h1>Jobs</h1>", _filters(query, mask), batch_form(query) if actions else ""]
    caption = "Jobs, most recently updated first"
    if query.job_id is not None:
        shown = esc(mask(query.job_id))
        caption = f"Job with id {shown}" if result.rows else f"No job with id {shown}"
    rows = "".join(_list_row(job, now) for job in result.rows)
    empty = '<tr><td colspan="8">No jobs match.</td></tr>' if not result.rows else ""
    parts.append(
        f'<div data-rows><table class="jobs"><caption>{caption}</caption><thead><tr>'
        '<th scope="col">Id</th><th scope="col">Agent</th><th scope="col">Status</th>'
        '<th scope="col">Attempt</th><th scope="col">Updated</th><th scope="col">Cost</th>'
        '<th scope="col">Tokens in / out</th><th scope="col">Crashes</th>'
        f"</tr></thead><tbody>{rows}{empty}</tbody></table>"
    )
    nav = []
    if query.after is not None:
        nav.append(f'<a href="/?{esc(_filter_query(query))}">Newest jobs</a>')
    if result.next_cursor is not None:
        nav.append(f'<a rel="next" href="/?{esc(_filter_query(query, result.next_cursor))}">Older jobs</a>')
    if nav:
        parts.append(f'<nav class="pages" aria-label="Pages">{" ".join(nav)}</nav>')
    parts.append("</div>")
    # The newest page refreshes its rows by itself (the script swaps the table, never the filter form).
    refresh = ' data-refresh="rows"' if query.after is None else ""
    return _page("Jobs", "".join(parts), actions=actions, live=refresh)


def overview_page(overview: Overview, *, actions: bool, now: float, mask: Callable[[str], str] = str) -> str:
    """The overview: the runnable queue, stale runs, the last hour, counts per status and agent."""
    main = overview_main(overview, mask, esc, now)
    return _page("Overview", main, actions=actions, live=' data-refresh="rows" data-every="15"')


def _filter_query(query: ListQuery, after: str | None = None) -> str:
    fields = {"status": query.status, "agent": query.agent, "after": after}
    return urlencode({k: v for k, v in fields.items() if v})


def _filters(query: ListQuery, mask: Callable[[str], str]) -> str:
    options = ['<option value="">any</option>'] + [
        f'<option value="{s}"{" selected" if query.status == s else ""}>{s}</option>' for s in JobStatus
    ]
    return (
        '<form class="filters" method="get" action="/" role="search" aria-label="Filter jobs">'
        f'<label for="f-status">Status</label><select id="f-status" name="status">{"".join(options)}</select>'
        '<label for="f-agent">Agent</label>'
        f'<input id="f-agent" name="agent" value="{esc(mask(query.agent or ""))}">'
        f'<label for="f-id">Job id</label><input id="f-id" name="id" value="{esc(mask(query.job_id or ""))}">'
        '<button type="submit">Show</button></form>'
    )


def _list_row(job: ListedJob, now: float) -> str:
    link = esc(urlencode({"id": job.key}))
    return (
        f'<tr><td class="id"><a href="/job?{link}">{_cut(job.id)}</a></td>'
        f'<td class="agent">{_cut(job.agent_id)}</td><td>{_status(job.status)}</td>'
        f"<td>{esc(job.attempt)}</td>"
        f"<td>{_age(job.updated_at, now)}</td><td>{_usd(job.cost_usd)}</td>"
        f"<td>{_num(job.tokens_in)} / {_num(job.tokens_out)}</td><td>{job.crashes}</td></tr>"
    )


def _cut(text: str, limit: int = LIST_CELL) -> str:
    """``text`` escaped, cut to ``limit`` characters, with the whole of it in a title."""
    if len(text) <= limit:
        return esc(text)
    return f'<span class="cut" title="{esc(text)}">{esc(text[: limit - 1])}…</span>'


def _status(status: str) -> str:
    return f'<span class="status s-{esc(status.lower())}">{esc(status)}</span>'


def _age(ts: Any, now: float) -> str:
    if ts is None:
        return "-"
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts):
        return "?"  # a time another client wrote as text, or PostgreSQL's infinity
    seconds = max(now - ts, 0.0)
    text = (
        f"{seconds:.0f} s ago"
        if seconds < 120
        else f"{seconds / 60:.0f} min ago"
        if seconds < 7200
        else f"{seconds / 3600:.0f} h ago"
        if seconds < 172800
        else f"{seconds / 86400:.0f} days ago"
    )
    return f'<time datetime="{esc(_iso(ts))}" title="{esc(_iso(ts))}">{text}</time>'


def _iso(ts: float) -> str:
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
    except (OverflowError, OSError, ValueError):
        return "?"


def _usd(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e15:
        return "$" + format_usd(float(value))
    return "-" if value is None else esc(value)


def _num(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else esc(value)


# -- one job ---------------------------------------------------------------------------------------------


def job_page(
    view: JobView,
    timeline: Timeline,
    *,
    actions: bool,
    flash: str | None,
    now: float,
    mask: Callable[[str], str] = str,
) -> str:
    """The job: its summary, what it waits for, actions, budget, timeline, conversation, payload, history.

    ``flash`` is what the server verified the store recorded (never text taken from the request).
    """
    row = view.row
    parts = [f'<h1>Job <span class="id">{esc(row.id)}</span></h1>']
    if flash:
        parts.append(f'<p class="flash" role="status">{esc(flash)}</p>')
    parts.append(_summary(view, now))
    parts.append(family_section(view.family, mask, esc))
    parts.append(approval_section(view, esc))
    if actions:
        parts.append(_actions(view))
    parts += [_budget(row), _timeline(view, timeline), journal_section(view, esc), _conversation(view)]
    parts.append(_section("payload", "Payload", f"<pre>{esc(_json(row.payload))}</pre>"))
    if row.result is not None or "result" in row.unreadable:
        parts.append(_section("result", "Result", f"<pre>{esc(_json(row.result))}</pre>"))
    history = "".join(f"<li>{esc(line)}</li>" for line in view.history) or "<li>(none)</li>"
    parts.append(_section("history", f"Crash history ({view.history_total})", f"<ol>{history}</ol>"))
    live = ""
    if row.status not in TERMINAL:
        live = (
            f' data-live="/job/state?{esc(urlencode({"id": view.key}))}" data-version="{esc(view.version)}"'
        )
    return _page(f"Job {row.id}", "".join(parts), actions=actions, live=live)


def _section(key: str, title: str, body: str) -> str:
    return f'<section aria-labelledby="h-{key}"><h2 id="h-{key}">{title}</h2>{body}</section>'


def _summary(view: JobView, now: float) -> str:
    row = view.row
    items = [
        ("Agent", esc(row.agent_id)),
        ("Status", _status(row.status)),
        ("Attempt", esc(row.attempt)),
        ("Updated", _age(row.updated_at, now)),
        ("Heartbeat", _age(row.heartbeat_at, now)),
        ("Checkpoint", esc(row.checkpoint_id or "-")),
        ("Concurrency key", esc(row.concurrency_key or "-")),
        ("Priority", esc(row.priority)),
    ]
    items += [("Unreadable column", esc(f"{name}: {why}")) for name, why in row.unreadable.items()]
    body = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items)
    waits = "".join(f"<li>{esc(line)}</li>" for line in view.waits_for)
    waiting = f'<h3>Waits for</h3><ul class="waits">{waits}</ul>' if waits else ""
    return _section("summary", "Summary", f'<dl class="summary">{body}</dl>{waiting}')


def _actions(view: JobView) -> str:
    row, key, forms = view.row, view.key, []
    if row.status == JobStatus.WAITING_FOR_APPROVAL:
        call = view.call
        # Always sent, empty when no call is shown: the approval is of what this page showed, nothing else.
        hidden = f'<input type="hidden" name="call" value="{esc(call or "")}">'
        forms.append(_form(key, "approve", "Approve", hidden))
        forms.append(_form(key, "reject", "Reject", _reason("approval rejected")))
    if row.status in CANCELLABLE:
        forms.append(_form(key, "cancel", "Cancel", _reason("cancelled by an operator")))
    if row.status in RETRYABLE:
        forms.append(_form(key, "retry", "Retry", ""))
    if row.status in PAUSABLE:
        forms.append(_form(key, "pause", "Pause", _reason(DEFAULT_PAUSE_REASON)))
    if row.status == JobStatus.PAUSED:
        forms.append(_form(key, "resume", "Resume", ""))
    body = "".join(forms) or "<p>No action applies to a job in this status.</p>"
    return _section("actions", "Actions", body)


def _form(job_id: str, action: str, label: str, extra: str) -> str:
    key = f"{action}-token"
    return (
        f'<form class="action" method="post" action="/job/action" aria-label="{label} this job">'
        f'<input type="hidden" name="id" value="{esc(job_id)}">'
        f'<input type="hidden" name="action" value="{action}">{extra.replace("$key", action)}'
        f'<label for="{key}">Console token</label>'
        f'<input id="{key}" name="token" type="password" autocomplete="off" required>'
        f'<button type="submit" name="submit" value="{action}">{label}</button></form>'
    )


def _reason(default: str) -> str:
    return (
        '<label for="$key-reason">Reason</label>'
        f'<input id="$key-reason" name="reason" maxlength="500" placeholder="{esc(default)}">'
    )


def _budget(row: JobRecord) -> str:
    used, limits = row.tokens_consumed, row.token_budget or {}
    rows = [
        (
            "Cost",
            _usd(used.get("cost_usd")),
            _usd(limits["max_cost_usd"]) if "max_cost_usd" in limits else None,
        ),
        ("Input tokens", _num(used.get("input")), _num(limits.get("max_input_tokens")) if limits else None),
        ("Output tokens", _num(used.get("output")), None),
    ]
    body = "".join(
        f'<tr><th scope="row">{name}</th><td>{spent}</td><td>{limit or "the process default"}</td></tr>'
        for name, spent, limit in rows
    )
    table = (
        '<table class="budget"><thead><tr><th scope="col">Budget</th><th scope="col">Used</th>'
        f'<th scope="col">Limit</th></tr></thead><tbody>{body}</tbody></table>'
    )
    return _section("budget", "Budget", table)


def _timeline(view: JobView, timeline: Timeline) -> str:
    svg = render_svg(timeline)
    notes = [view.journal_note] if view.journal_note else []
    if timeline.dropped:
        notes.append(f"{timeline.dropped} more bars are not drawn")
    notes += [f"{s.name}: {s.bad_lines} unreadable lines skipped" for s in view.sessions if s.bad_lines]
    notes += [f"{s.name}: only its first events are read" for s in view.sessions if s.truncated]
    note = "".join(f'<p class="note">{esc(n)}</p>' for n in notes)
    bounds = timeline.bounds
    t0 = bounds[0] if bounds else 0.0
    items = "".join(_timeline_item(item, t0) for item in timeline.ordered())
    listing = f'<ol class="timeline-list">{items}</ol>' if items else "<p>Nothing recorded yet.</p>"
    source = "the session journals" if timeline.source == "journal" else "the row's crash history"
    body = f'<p class="note">From {source}.</p>{note}<figure>{svg}</figure>' if svg else note
    return _section("timeline", "Timeline", body + listing)


def _timeline_item(item: Span | Mark, t0: float) -> str:
    if isinstance(item, Span):
        length = item.end - item.start
        return (
            f'<li class="t-{esc(item.lane)}"><span class="at">+{item.start - t0:.3f} s</span> '
            f'{esc(item.label)} <span class="took">({length:.3f} s)</span></li>'
        )
    return f'<li class="t-mark"><span class="at">+{item.at - t0:.3f} s</span> {esc(item.label)}</li>'


# -- the conversation ------------------------------------------------------------------------------------


def _conversation(view: JobView) -> str:
    note = f'<p class="note">{esc(view.conversation_note)}</p>' if view.conversation_note else ""
    if not view.messages:
        return _section("conversation", "Conversation", note + "<p>No conversation recorded.</p>")
    bubbles = "".join(_bubble(index, message) for index, message in enumerate(view.messages))
    count = f" ({view.message_total} messages)"
    return _section("conversation", "Conversation" + count, f'{note}<ol class="chat">{bubbles}</ol>')


def _bubble(index: int, message: Any) -> str:
    if not isinstance(message, Mapping):
        return f'<li class="bubble other"><pre>{esc(_json(message))}</pre></li>'
    role = message.get("role") if isinstance(message.get("role"), str) else "?"
    css = role if role in ("user", "assistant", "system") else "other"
    content = message.get("content")
    blocks = [content] if isinstance(content, str) else content if isinstance(content, list) else [content]
    inner = "".join(_block(block) for block in blocks)
    return (
        f'<li class="bubble {css}" aria-label="message {index + 1}, {esc(role)}">'
        f'<p class="role">{esc(role)}</p>{inner}</li>'
    )


def _block(block: Any) -> str:
    if isinstance(block, str):
        return f'<p class="text">{esc(block)}</p>'
    if not isinstance(block, Mapping):
        return f"<pre>{esc(_json(block))}</pre>"
    kind = block.get("type")
    if kind == "text":
        return f'<p class="text">{esc(block.get("text"))}</p>'
    if kind == "tool_use":
        return (
            f'<div class="tool-use"><p>Calls tool <code>{esc(block.get("name"))}</code>'
            f' <span class="ref">({esc(block.get("id"))})</span></p>'
            f"<pre>{esc(_json(block.get('input')))}</pre></div>"
        )
    if kind == "tool_result":
        failed = " failed" if block.get("is_error") else ""
        inner = block.get("content")
        shown = "".join(_block(b) for b in inner) if isinstance(inner, list) else _block(inner)
        return (
            f'<div class="tool-result{failed}"><p>Result of <span class="ref">{esc(block.get("tool_use_id"))}'
            f"</span>{' (an error)' if failed else ''}</p>{shown}</div>"
        )
    return f"<pre>{esc(_json(block))}</pre>"


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return repr(value)
