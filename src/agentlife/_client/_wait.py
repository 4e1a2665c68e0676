"""`Client.result`'s wait for a job's end, and the answer it gives: the result or a typed error.

The wait reads the row, and sleeps until something may have changed: on PostgreSQL until the trigger ``db
init`` makes announces the end of this job (``NOTIFY`` on the store's end channel, see `PgListener`), or
`NOTIFIED_POLL_SECONDS` at most, so a database without the trigger, a dropped ``LISTEN`` connection or a
lost notification only slows the answer; on SQLite, which cannot notify another process, it polls with a
short backoff (`POLL_FIRST_SECONDS` doubling to `POLL_MAX_SECONDS`). Only a terminal status ends the wait:
a job that crashed and is retried (RETRYING, then RUNNING again) is waited for to its final outcome.

A store that cannot be reached for a while (a database restarted, a failover) does not end the wait: it
reads again every second for up to `OUTAGE_SECONDS`, then raises the `StoreUnavailable`; the job itself
never depended on the wait.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import anyio

from agentlife._exceptions import (
    ConfigError,
    JobCancelled,
    JobDeadLettered,
    JobFailed,
    JobNotFound,
    ResultTimeout,
    StoreError,
    StoreUnavailable,
)
from agentlife._jobs._mask import Masker
from agentlife.stores import JobRecord, JobStatus, OperatorStore
from agentlife.stores._jobs import TERMINAL
from agentlife.stores._prune import pruned_message

if TYPE_CHECKING:
    from agentlife.stores._pg_listen import PgListener

__all__ = [
    "NOTIFIED_POLL_SECONDS",
    "OUTAGE_SECONDS",
    "POLL_FIRST_SECONDS",
    "POLL_MAX_SECONDS",
    "check_timeout",
    "outcome",
    "wait_for_end",
]

#: SQLite: the first pause between two reads of the row; each pause doubles up to `POLL_MAX_SECONDS`.
POLL_FIRST_SECONDS = 0.01
POLL_MAX_SECONDS = 0.5
#: PostgreSQL: the longest pause between two reads, when no notification comes.
NOTIFIED_POLL_SECONDS = 1.0
#: How long the store may stay unreachable during a wait before the wait gives up (it reads each second).
OUTAGE_SECONDS = 60.0
#: The most characters of the crash record's text an error's message quotes.
_QUOTED = 500


def check_timeout(timeout: object) -> float:
    """The seconds `Client.result` may wait: ``timeout``, or ``inf`` for None; `ConfigError` in one line.

    0, negative, NaN and what is not a number are refused: a wait of no time is `Client.get`.
    """
    if timeout is None:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ConfigError(f"timeout must be a number of seconds or None, got {type(timeout).__name__}")
    if math.isnan(timeout) or timeout <= 0:
        raise ConfigError(
            f"timeout {timeout!r} must be a number of seconds > 0 (None or inf: no limit; to read the job "
            "without waiting, use get())"
        )
    return float(timeout)


async def wait_for_end(
    store: OperatorStore, job_id: str, seconds: float, listener: PgListener | None
) -> JobRecord:
    """The row of ``job_id`` once its status is terminal.

    Raises:
        JobNotFound: there is no such job (or it was deleted while waited for).
        ResultTimeout: ``seconds`` passed first (the store unreachable at the end of it, too: the caller
            catching timeouts must not learn of an outage shorter than `OUTAGE_SECONDS` another way).
        StoreUnavailable: the store could not be reached for `OUTAGE_SECONDS`.
    """
    deadline = anyio.current_time() + seconds
    pause = POLL_FIRST_SECONDS
    outage: float | None = None
    status = "unknown: the store cannot be reached"
    while True:
        try:
            row = await store.get_job(job_id)
        except StoreUnavailable as exc:
            now = anyio.current_time()
            outage = now if outage is None else outage
            if now - outage >= OUTAGE_SECONDS:
                raise
            if now >= deadline:
                raise ResultTimeout(job_id, status, seconds) from exc
            await anyio.sleep(min(deadline - now, 1.0))
            continue
        outage = None
        if row is None:
            raise JobNotFound(pruned_message(job_id, await store.pruned_job(job_id)))
        status = f"{row.status} when last read"
        if row.status in TERMINAL:
            return row
        left = deadline - anyio.current_time()
        if left <= 0:
            raise ResultTimeout(job_id, row.status, seconds)
        if listener is not None:
            await listener.wait(job_id, min(left, NOTIFIED_POLL_SECONDS))
        else:
            await anyio.sleep(min(left, pause))
            pause = min(pause * 2, POLL_MAX_SECONDS)


def outcome(row: JobRecord, masker: Masker) -> Any:
    """The result of a job that ended COMPLETED; the typed error of one that ended otherwise.

    Raises:
        JobDeadLettered: DEAD_LETTER.
        JobCancelled: FAILED by a cancel.
        JobFailed: FAILED otherwise.
        StoreError: COMPLETED, but its result column cannot be read (a row written badly).
    """
    if row.status == JobStatus.COMPLETED:
        why = row.unreadable.get("result")
        if why:
            raise StoreError(
                f"job {row.id} completed but its result cannot be read: {masker.text(why, _QUOTED)}"
            )
        return row.result
    last = row.error[-1] if row.error and isinstance(row.error[-1], dict) else None
    kind: type[JobFailed] = JobFailed
    if row.status == JobStatus.DEAD_LETTER:
        kind = JobDeadLettered
    elif last is not None and last.get("error_class") == "Cancelled":
        kind = JobCancelled
    message = f"job {row.id} ended {row.status} on attempt {row.attempt}"
    if last is not None:
        what = last.get("error_class") or last.get("event") or "?"
        said = f"{what}: {last.get('message', '')}"
        message += f": {masker.text(said, _QUOTED)}"
    raise kind(
        " ".join(message.splitlines()), job_id=row.id, status=row.status, attempt=row.attempt, last_error=last
    )
