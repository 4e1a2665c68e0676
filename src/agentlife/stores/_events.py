"""Events sent to jobs (``job send``, `CheckpointStore.send_event`) and taken by ``ctx.wait_for_event``.

An event is a row of the ``job_event`` table: job id, name, JSON payload, the order it was sent in
(``seq``) and, once a wait took it, ``taken_by``: the invocation id of that wait. Events are kept until a
wait of their name takes them, oldest first, so an event sent before the wait, or under a name nothing waits
for yet, is not lost. A wait takes an event in one conditional write bound to its invocation id: a process
that dies after the take and before it journaled the outcome finds the same event again under the same
invocation id, so every event is delivered to exactly one wait, once.

Sending locks the job row, refuses an unknown (`JobNotFound`) or terminal (`JobStateConflict`) job, and
wakes a job parked WAITING for that name (``not_before`` now, and on PostgreSQL ``NOTIFY`` in the same
transaction). Parking (`CheckpointStore.park_waiting`) locks the row too and checks for an event already
sent, so an event sent while the job parks is never left without a wake-up.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from agentlife._config import validate_payload
from agentlife._exceptions import AttemptFenced, ConfigError, JobStateConflict
from agentlife._replay import check_replayable
from agentlife.stores._base import JobStatus
from agentlife.stores._jobs import TERMINAL
from agentlife.stores._prune import not_found

if TYPE_CHECKING:
    from agentlife.stores._dialect import Tx

__all__ = [
    "MAX_EVENT_NAME_CHARS",
    "MAX_EVENT_PAYLOAD_BYTES",
    "MAX_KEPT_EVENTS",
    "check_event",
    "check_event_name",
    "kept_events",
    "send_event",
    "take_event",
    "waits_for",
]

_log = logging.getLogger("agentlife.store")

#: The largest payload an event may carry (its JSON): it is journaled as the wait's outcome.
MAX_EVENT_PAYLOAD_BYTES = 256 * 1024
#: The longest event name.
MAX_EVENT_NAME_CHARS = 200
#: The most events a job may keep that no wait has taken: a sender looping on a job that never waits for
#: its name is refused rather than allowed to grow the table without end.
MAX_KEPT_EVENTS = 1000


def check_event_name(name: object) -> None:
    """`ConfigError` saying why, unless ``name`` is a usable event name."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_EVENT_NAME_CHARS:
        raise ConfigError(f"an event name is a non-empty string of at most {MAX_EVENT_NAME_CHARS} characters")
    if not name.isprintable():
        raise ConfigError(f"event name {name!r} holds control characters")


def check_event(name: object, payload: Any) -> bytes:
    """The payload's JSON when ``name`` and ``payload`` make an event, else `ConfigError` saying why."""
    check_event_name(name)
    validate_payload(payload, "the event's payload")  # as a job's: what both stores keep as given
    try:
        check_replayable(payload, "the event's payload")
        data = orjson.dumps(payload)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"the event's payload is not JSON the journal can hold: {exc}") from None
    if len(data) > MAX_EVENT_PAYLOAD_BYTES:
        raise ConfigError(
            f"the event's payload is {len(data)} bytes of JSON, more than {MAX_EVENT_PAYLOAD_BYTES}"
        )
    return data


def waits_for(waiting: Any, name: str) -> bool:
    """Whether a row's ``waiting`` column (decoded or JSON text) names the event ``name``."""
    if isinstance(waiting, str | bytes):
        try:
            waiting = orjson.loads(waiting)
        except orjson.JSONDecodeError:
            return False
    events = waiting.get("events") if isinstance(waiting, dict) else None
    return isinstance(events, list) and name in events


def _refuse(job_id: str, name: str, status: str) -> None:
    if status in TERMINAL:
        raise JobStateConflict(f"cannot send {name!r} to job {job_id}: it is {status}")


def _refuse_full(job_id: str, kept: int) -> None:
    if kept >= MAX_KEPT_EVENTS:
        raise JobStateConflict(
            f"job {job_id} already keeps {kept} events no wait has taken (at most {MAX_KEPT_EVENTS});"
            " nothing was sent"
        )


async def send_event(tx: Tx, job_id: str, name: str, payload: Any) -> int:
    """Keep an event for the job and wake it if it waits for ``name``; its sequence number.

    Raises:
        ConfigError: not an event (`check_event`).
        JobNotFound, JobStateConflict: no such job, or it has ended or keeps too many events.
    """
    data = check_event(name, payload).decode()
    async with tx.atomic():
        # The row lock orders this send with a park of the same job (see the module docstring).
        found = await tx.fetchrow(tx.sql.lock_wait, job_id=job_id)
        if found is None:
            raise await not_found(tx, job_id)
        _refuse(job_id, name, found["status"])
        assert found is not None
        _refuse_full(job_id, int(await tx.fetchval(tx.sql.count_kept, job_id=job_id)))
        seq = await tx.fetchval(tx.sql.insert_event, job_id=job_id, name=name, payload=data)
        if found["status"] == JobStatus.WAITING and waits_for(found["waiting"], name):
            await tx.execute(tx.sql.wake, job_id=job_id)
    return int(seq)


async def take_event(
    tx: Tx, job_id: str, attempt: int, names: Sequence[str], invocation_id: str, sent_by: float | None
) -> tuple[str, Any] | None:
    """The event the wait ``invocation_id`` took, else the oldest untaken of ``names`` sent by ``sent_by``.

    An event whose payload cannot be read (a row written by hand: not JSON, a number no float holds, nested
    deeper than JSON is read) would fail the wait on every attempt: it is set aside instead, marked taken by
    ``unreadable:`` and the wait's id (so no wait takes it and `kept_events` no longer counts it), with a
    warning, and the next event is taken.

    Raises:
        AttemptFenced: the row is another attempt's.
    """
    async with tx.atomic():
        held = await tx.fetchval(tx.sql.lock_attempt, job_id=job_id)
        if held != attempt:
            raise AttemptFenced(f"job {job_id}: event taken by attempt {attempt} refused")
        while True:  # each pass takes one event, and a job keeps a bounded number of them
            taken = await tx.fetchrow(tx.sql.event_taken, job_id=job_id, invocation_id=invocation_id)
            if taken is None:
                taken = await tx.fetchrow(
                    tx.sql.take_event,
                    job_id=job_id,
                    names=list(names),
                    invocation_id=invocation_id,
                    sent_by=math.inf if sent_by is None else sent_by,
                )
            if taken is None:
                return None
            try:
                return str(taken["name"]), _payload(taken["payload"])
            except (ValueError, TypeError, RecursionError) as exc:
                _log.warning(
                    "job %s: event %r has a payload that cannot be read (%s); set aside, not delivered",
                    job_id,
                    taken["name"],
                    type(exc).__name__,
                )
                aside = {"invocation_id": invocation_id, "mark": f"unreadable:{invocation_id}"}
                await tx.execute(tx.sql.set_event_aside, job_id=job_id, **aside)


def _payload(stored: object) -> Any:
    """A stored event payload as the JSON value it holds (None for none)."""
    if stored is None:
        return None
    if not isinstance(stored, str | bytes):
        raise TypeError("not text")
    return orjson.loads(stored)


async def kept_events(tx: Tx, job_id: str) -> dict[str, int]:
    """How many events of each name the job keeps that no wait has taken yet (oldest name first)."""
    return {str(row[0]): int(row[1]) for row in await tx.fetch(tx.sql.kept_events, job_id=job_id)}
