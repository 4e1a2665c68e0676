"""The console's on-call parts: the overview page, the approval asked, a job's family and its journals.

As everywhere in the console, what these show comes masked (the ids links address excepted) and is
escaped by `esc` where it enters the markup.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

import orjson

from agentlife._console._data import JobView
from agentlife.stores import JobStatus
from agentlife.stores._childjobs import JobFamily
from agentlife.stores._overview import MAX_STALE, Overview

__all__ = ["MAX_CHILDREN", "approval_section", "family_section", "journal_section", "overview_main"]

#: The most children the job page links to (the count says how many there are).
MAX_CHILDREN = 100
#: The statuses the jobs list filters by: a count of any other is not a link.
_LISTED = frozenset(str(status) for status in JobStatus)
_ENDED = (("COMPLETED", "Completed"), ("FAILED", "Failed"), ("DEAD_LETTER", "Dead-lettered"))

_Esc = Callable[[Any], str]


def approval_section(view: JobView, esc: _Esc) -> str:
    """What the parked call asks: the tool, its arguments and the model's text before it (all masked)."""
    request = view.request
    if request is None:
        return ""
    items = [("Tool", f"<code>{esc(request.get('tool'))}</code>"), ("Step", esc(request.get("step")))]
    items.append(("Invocation", f'<span class="ref">{esc(request.get("invocation_id"))}</span>'))
    body = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items)
    parts = [f'<dl class="summary">{body}</dl>']
    said = request.get("said")
    if isinstance(said, str) and said:
        parts.append(f'<h3>The model said before the call</h3><p class="said">{esc(said)}</p>')
    if "arguments" in request:
        parts.append(f'<h3>Arguments</h3><pre class="arguments">{esc(_json(request["arguments"]))}</pre>')
    else:
        parts.append(
            '<p class="note">The arguments are not recorded with this request (asked by an older version):'
            f" its digest is {esc(request.get('digest'))}.</p>"
        )
    return (
        '<section aria-labelledby="h-approval" class="approval"><h2 id="h-approval">Approval asked</h2>'
        f"{''.join(parts)}</section>"
    )


def family_section(family: JobFamily | None, masked: Callable[[str], str], esc: _Esc) -> str:
    """Links to the job's parent and to the children it started (the first `MAX_CHILDREN`)."""
    if family is None or (family.parent_id is None and not family.children):
        return ""
    parts = []
    if family.parent_id is not None:
        link = _job_link(family.parent_id, masked, esc)
        how = " (detached)" if family.detached else ""
        parts.append(f'<p class="parent">Started by {link}{how}</p>')
    if family.children:
        rows = "".join(
            f"<li>{_job_link(child, masked, esc)} {_status(masked(status), esc)}"
            f"{' (detached)' if detached else ''}</li>"
            for child, status, detached in family.children[:MAX_CHILDREN]
        )
        more = len(family.children) - MAX_CHILDREN
        tail = f'<p class="note">and {more} more</p>' if more > 0 else ""
        parts.append(f'<h3>Children ({len(family.children)})</h3><ul class="children">{rows}</ul>{tail}')
    heading = '<h2 id="h-family">Parent and children</h2>'
    return f'<section aria-labelledby="h-family">{heading}{"".join(parts)}</section>'


def journal_section(view: JobView, esc: _Esc) -> str:
    """Download links for the session journals the console can read, or why there are none."""
    if not view.sessions:
        why = view.journal_note or "no journal readable by the console here"
        body = (
            f'<p class="note">{esc(why)}. A journal is downloadable only from the disk this console reads'
            " (its AGENTLIFE_DATA_DIR).</p>"
        )
    else:
        items = "".join(
            f'<li><a download href="/job/journal?{esc(urlencode({"id": view.key, "session": s.name}))}">'
            f"{esc(s.name)}</a></li>"
            for s in view.sessions
        )
        body = (
            f'<p class="note">Each attempt\'s journal, secrets masked.</p><ul class="journals">{items}</ul>'
        )
    return f'<section aria-labelledby="h-journals"><h2 id="h-journals">Journals</h2>{body}</section>'


def overview_main(overview: Overview, masked: Callable[[str], str], esc: _Esc, now: float) -> str:
    """The overview page's body: the queue, stale runs, the last hour, and counts per status and agent."""
    statuses = sorted({status for status, _ in overview.counts})
    agents = sorted({agent for _, agent in overview.counts})
    oldest = (
        f"the oldest runnable for {_seconds(max(overview.at - overview.oldest_runnable, 0.0))}"
        if overview.oldest_runnable is not None
        else "none waiting"
    )
    ended = " · ".join(f"{label}: {overview.ended.get(status, 0)}" for status, label in _ENDED)
    cards = (
        '<ul class="cards">'
        f'<li><span class="big" id="o-runnable">{overview.runnable}</span> runnable, waiting for a worker'
        f' <span class="note">({esc(oldest)})</span></li>'
        f'<li><span class="big" id="o-stale">{overview.stale}</span> RUNNING with a stale heartbeat'
        f' <span class="note">(older than {overview.stale_after:g} s, the reaper\'s limit, or none)'
        "</span></li>"
        f'<li>In the last hour: <span id="o-ended">{esc(ended)}</span></li></ul>'
    )
    stale = ""
    if overview.stale_rows:
        rows = "".join(
            f"<li>{_job_link(job_id, masked, esc)} heartbeat "
            f"{esc(_seconds(max(now - beat, 0.0)) + ' ago' if beat is not None else 'never')}</li>"
            for job_id, beat in overview.stale_rows
        )
        more = " (the stalest shown)" if overview.stale > MAX_STALE else ""
        stale = f'<h2>Stale RUNNING jobs{more}</h2><ul class="stale">{rows}</ul>'
    head = "".join(f'<th scope="col">{esc(masked(s))}</th>' for s in statuses)
    body = "".join(_agent_row(agent, statuses, overview.counts, masked, esc) for agent in agents)
    totals = "".join(
        f'<td data-status="{esc(masked(s))}" data-agent="">'
        f"{_count(sum(n for (st, _), n in overview.counts.items() if st == s), s, None, masked, esc)}</td>"
        for s in statuses
    )
    more = (
        '<p class="note">More (status, agent) pairs exist than are counted here.</p>'
        if overview.more_groups
        else ""
    )
    table = (
        '<table class="overview"><caption>Jobs per agent and status (each count links to the list)</caption>'
        f'<thead><tr><th scope="col">Agent</th>{head}</tr></thead><tbody>{body}'
        f'<tr class="total"><th scope="row">All agents</th>{totals}</tr></tbody></table>{more}'
        if statuses
        else "<p>No jobs in this store.</p>"
    )
    when = time.strftime("%H:%M:%S UTC", time.gmtime(overview.at))
    body = f'<p class="note">As the store said at {esc(when)}.</p>{cards}{stale}{table}'
    return f"<h1>Overview</h1><div data-rows>{body}</div>"


def _agent_row(
    agent: str,
    statuses: list[str],
    counts: Mapping[tuple[str, str], int],
    masked: Callable[[str], str],
    esc: _Esc,
) -> str:
    cells = []
    for status in statuses:
        shown = _count(counts.get((status, agent), 0), status, agent, masked, esc)
        cells.append(
            f'<td data-status="{esc(masked(status))}" data-agent="{esc(masked(agent))}">{shown}</td>'
        )
    return f'<tr><th scope="row">{esc(masked(agent))}</th>{"".join(cells)}</tr>'


def _count(count: int, status: str, agent: str | None, masked: Callable[[str], str], esc: _Esc) -> str:
    """A count, linked to the jobs list that shows those rows when a link can say which they are.

    Not a link when there is no row, when the status is not one the list filters by (a row another
    client wrote with its own status: the list would refuse it), or when the agent id holds what the
    masker hides: the link would carry the secret the cell masks.
    """
    if not count or status not in _LISTED or (agent is not None and masked(agent) != agent):
        return str(count)
    query = {"status": status} if agent is None else {"status": status, "agent": agent}
    return f'<a href="/?{esc(urlencode(query))}">{count}</a>'


def _job_link(job_id: str, masked: Callable[[str], str], esc: _Esc) -> str:
    return f'<a href="/job?{esc(urlencode({"id": job_id}))}">{esc(masked(job_id))}</a>'


def _status(status: str, esc: _Esc) -> str:
    return f'<span class="status s-{esc(status.lower())}">{esc(status)}</span>'


def _seconds(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return repr(value)
