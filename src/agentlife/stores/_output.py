"""A running job's output: the events it published, its status changes and its end, in one order per job.

Every row of the ``job_output`` table has the job's next ``seq`` (1, 2, 3 ... per job, no gaps in what a
reader sees): ``published`` rows are written by `publish_output` (``ctx.publish``), ``status`` and ``end``
rows by a trigger on the job table, in the very statement that changes the row's status, whoever wrote it
(this runtime, an operator command, a control plane's own ``UPDATE``). Both take the job row's lock before
they read the job's last ``seq``, so the two kinds of writer take turns per job and a reader that reads
``seq > cursor`` in order misses nothing: a row committed later always has a larger ``seq``.

A published row carries the invocation id of the call that published it, unique per job: the same call
replayed after a crash (on this pod or another) finds its row and writes nothing. The write is fenced like
the step's other records (the attempt and claim token must still hold the live job).

Live model text (``delta`` events) is not kept here: `send_deltas` hands a batch to the followers that are
listening now (PostgreSQL: ``NOTIFY`` on the job's channel; SQLite: a ring of `DELTA_SLOTS` rows per job in
``job_output_delta``, overwritten in place, removed a minute after the job ended).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from agentlife import constants
from agentlife._config import validate_payload
from agentlife._exceptions import AttemptFenced, ConfigError
from agentlife._replay import check_replayable
from agentlife.constants import MAX_OUTPUT_NAME_CHARS, MAX_OUTPUT_VALUE_BYTES

if TYPE_CHECKING:
    from agentlife.stores._dialect import Row, Tx

__all__ = [
    "DELTA_SLOTS",
    "OutputRow",
    "check_output",
    "output_head",
    "publish_output",
    "read_deltas",
    "read_output",
    "send_deltas",
]

_log = logging.getLogger("agentlife.store")

#: The recent delta batches SQLite keeps per job (a follower polling slower than this many batches
#: misses the oldest: deltas are best effort, the published events are exact).
DELTA_SLOTS = 64
#: The kinds of rows the table holds.
KINDS = frozenset({"published", "status", "end"})


@dataclass(frozen=True, slots=True)
class OutputRow:
    """One row of a job's output as read back; ``value`` is its JSON text (None when it holds none)."""

    seq: int
    kind: str
    name: str
    value: bytes | None
    at: float


def check_output(name: object, value: Any) -> bytes:
    """The value's JSON when ``name`` and ``value`` make a published event, else `ConfigError` saying why."""
    if not isinstance(name, str) or not name or len(name) > MAX_OUTPUT_NAME_CHARS:
        raise ConfigError(
            f"ctx.publish: the name is a non-empty string of at most {MAX_OUTPUT_NAME_CHARS} characters"
        )
    if not name.strip() or not name.strip("\u200b\ufeff"):  # str.strip takes every Unicode space
        raise ConfigError("ctx.publish: the name is blank: it needs a visible character")
    if not name.isprintable():
        raise ConfigError(
            f"ctx.publish: name {name[:40]!r} holds control characters or other unprintable ones"
        )
    validate_payload(value, "ctx.publish: the value")
    try:
        check_replayable(value, "the value")
        data = orjson.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"ctx.publish: the value is not JSON: {exc}") from None
    if len(data) > MAX_OUTPUT_VALUE_BYTES:
        raise ConfigError(
            f"ctx.publish: the value is {len(data)} bytes of JSON, more than {MAX_OUTPUT_VALUE_BYTES}"
        )
    return data


async def publish_output(
    tx: Tx,
    job_id: str,
    attempt: int,
    owner: str,
    invocation_id: str,
    name: str,
    value: bytes,
    limit: int | None = None,
) -> int:
    """Add a published event to the job's output once per ``invocation_id``; its ``seq``.

    Raises:
        AttemptFenced: another attempt or process holds the job, or it has ended; nothing was written.
        ConfigError: the job's output already holds ``limit`` events; nothing was written.
    """
    limit = constants.MAX_OUTPUT_EVENTS_PER_JOB if limit is None else limit
    async with tx.atomic():
        if not await tx.execute(tx.sql.lock_publisher, job_id=job_id, attempt=attempt, owner=owner):
            raise AttemptFenced(
                f"job {job_id}: publish of attempt {attempt} refused, it no longer holds the job"
            )
        seq = await tx.fetchval(tx.sql.published_by, job_id=job_id, invocation_id=invocation_id)
        if seq is not None:
            return int(seq)  # this call published before a crash: the same event, not a second one
        head = int(await tx.fetchval(tx.sql.output_head, job_id=job_id) or 0)
        if head >= limit:
            raise ConfigError(
                f"ctx.publish: job {job_id} already holds {head} output events (at most {limit});"
                " nothing was published"
            )
        await tx.execute(
            tx.sql.insert_output,
            job_id=job_id,
            seq=head + 1,
            name=name,
            value=value.decode(),
            invocation_id=invocation_id,
        )
        return head + 1


async def output_head(tx: Tx, job_id: str) -> int | None:
    """The ``seq`` of the job's last output row (0 when none); None when the job does not exist."""
    row = await tx.fetchrow(tx.sql.output_job_head, job_id=job_id)
    if row is None:
        return None
    return int(row[0] or 0)


async def read_output(tx: Tx, job_id: str, after: int, limit: int) -> list[OutputRow]:
    """The job's output rows after ``after``, in order, at most ``limit``.

    A row the store cannot read (a hand-written ``INSERT`` of a kind or value that is not one, text that
    is not UTF-8) comes back with kind ``unreadable``: the follower passes over it, and its ``seq`` still
    moves the cursor on.
    """
    rows = await tx.fetch(tx.sql.read_output, job_id=job_id, after=after, limit=limit)
    return [_row(job_id, row) for row in rows if isinstance(row[0], int) and not isinstance(row[0], bool)]


def _row(job_id: str, row: Row) -> OutputRow:
    seq, kind, name, value, at = (row[i] for i in range(5))
    text = [_text(kind), _text(name)]
    data = _bytes(value)
    when = float(at) if isinstance(at, int | float) and not isinstance(at, bool) else 0.0
    if text[0] not in KINDS or text[1] is None or (value is not None and data is None):
        _log.warning("job %s: output row %s is not one this version reads; passed over", job_id, seq)
        return OutputRow(seq, "unreadable", "", None, when)
    return OutputRow(seq, text[0], text[1], data, when)


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return None
    return None


def _bytes(value: Any) -> bytes | None:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return None


# -- live model text -------------------------------------------------------------------------------------


async def send_deltas(tx: Tx, job_id: str, payloads: Sequence[str]) -> None:
    """Hand batches of model text (JSON text each) to the job's followers; nothing durable.

    SQLite writes them without an fsync (``synchronous=OFF`` for this write alone): a lost batch costs a
    follower some text, never the store its durability.
    """
    if not payloads:
        return
    quiet, loud = tx.sql.unsynced_on, tx.sql.unsynced_off
    if quiet is not None:
        await tx.execute(quiet)
    try:
        await tx.execute(tx.sql.send_deltas, job_id=job_id, payloads=list(payloads))
    finally:
        if loud is not None:
            await tx.execute(loud)


async def read_deltas(tx: Tx, job_id: str, after: int | None) -> tuple[int, list[bytes]]:
    """SQLite: the delta batches kept after ``after`` (None: none, only where they stand); the last seq."""
    if after is None:
        return int(await tx.fetchval(tx.sql.delta_head, job_id=job_id) or 0), []
    rows = await tx.fetch(tx.sql.read_deltas, job_id=job_id, after=after)
    last, batches = after, []
    for seq, data in rows:
        if isinstance(seq, int) and seq > last:
            last = seq
        raw = _bytes(data)
        if raw is not None:
            batches.append(raw)
    return last, batches
