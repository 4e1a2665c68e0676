"""The jobs list's action on every job matching its filter: the form, the count to confirm, the outcome.

Under a filtered list (a status or an agent) the console offers retry, cancel, pause and resume of every
job the filter matches. The first post selects (`agentlife._jobs._batch.select_jobs`, bounded) and shows
the count and the ids with a form to confirm exactly those jobs; the second acts only if the selection
still names the same jobs (their count and a digest of their ids; else 409, nothing done), each job in
its own transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from agentlife._console._data import ListQuery
from agentlife._jobs._batch import BATCH_ACTIONS, BatchReport, selection_digest

__all__ = ["SHOWN_IDS", "batch_confirm", "batch_form", "batch_outcome"]

#: The most ids the confirmation and the outcome list (the count is always whole).
SHOWN_IDS = 200


def _esc(value: object) -> str:
    return escape(str(value), quote=True)


def _hidden(status: str | None, agent: str | None) -> str:
    fields = {"status": status or "", "agent": agent or ""}
    return "".join(f'<input type="hidden" name="{k}" value="{_esc(v)}">' for k, v in fields.items())


def batch_form(query: ListQuery) -> str:
    """The form under a filtered list (status or agent); nothing for an unfiltered one or a single id."""
    if (query.status is None and query.agent is None) or query.job_id is not None:
        return ""
    names = [n for n, a in BATCH_ACTIONS.items() if query.status is None or query.status in a.statuses]
    if not names:
        return ""
    options = "".join(f'<option value="{n}">{n}</option>' for n in names)
    hidden = _hidden(query.status, query.agent)
    return (
        '<form class="batch" method="post" action="/jobs/batch" aria-label="Act on every matching job">'
        f"{hidden}"
        f'<label for="b-action">Every job matching the filter</label><select id="b-action" name="action">'
        f"{options}</select>"
        '<label for="b-token">Console token</label>'
        '<input id="b-token" name="token" type="password" autocomplete="off" required>'
        '<button type="submit">Select…</button></form>'
    )


def batch_confirm(
    action: str, status: str | None, agent: str | None, ids: Sequence[str], mask: Callable[[str], str]
) -> str:
    """The count and the ids a selection names, and the form that acts on exactly that count."""
    shown = "".join(f"<li>{_esc(mask(job_id))}</li>" for job_id in ids[:SHOWN_IDS])
    more = f"<p>and {len(ids) - SHOWN_IDS} more</p>" if len(ids) > SHOWN_IDS else ""
    reason = ""
    if BATCH_ACTIONS[action].takes_reason:
        reason = '<label for="c-reason">Reason</label><input id="c-reason" name="reason" maxlength="500">'
    return (
        f"<h1>{_esc(action.capitalize())} {len(ids)} jobs?</h1>"
        f'<p data-count="{len(ids)}">The filter matches {len(ids)} jobs that {_esc(action)} acts on:</p>'
        f'<ol class="ids">{shown}</ol>{more}'
        '<form class="batch" method="post" action="/jobs/batch" aria-label="Confirm">'
        f'<input type="hidden" name="action" value="{_esc(action)}">{_hidden(status, agent)}'
        f'<input type="hidden" name="expect" value="{len(ids)}">'
        f'<input type="hidden" name="digest" value="{selection_digest(ids)}">{reason}'
        '<label for="c-token">Console token</label>'
        '<input id="c-token" name="token" type="password" autocomplete="off" required>'
        f'<button type="submit">{_esc(action.capitalize())} these {len(ids)} jobs</button></form>'
        '<p><a href="/">Back to the jobs</a></p>'
    )


def batch_outcome(report: BatchReport, mask: Callable[[str], str]) -> str:
    """What a batch did: the summary, then each job skipped and why."""
    skipped = "".join(
        f"<li>{_esc(mask(job_id))}: {_esc(mask(why))}</li>" for job_id, why in report.skipped[:SHOWN_IDS]
    )
    return (
        f"<h1>{_esc(report.action.capitalize())}: done</h1>"
        f'<p role="status">{_esc(mask(report.summary()))}</p>'
        + (f'<h2>Skipped</h2><ol class="ids">{skipped}</ol>' if skipped else "")
        + '<p><a href="/">Back to the jobs</a></p>'
    )
