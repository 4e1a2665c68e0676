"""`follow_job`: a job's output after a cursor, in order, each event once, ending after the job's end.

The follower enters the store's watch of the job first (PostgreSQL: ``LISTEN`` on the job's channel;
SQLite: a poll of the recent delta batches), then reads the rows after its cursor: a row committed after
that read wakes the watch, so nothing is missed, and reading ``seq > cursor`` in order sees nothing twice.
Rejoining with the cursor of the last event seen goes on exactly after it, from any process.

It ends after the job's end event, when that is the last row of the output (a job retried after it ended
goes on, and so does its follower). A job that ended before its store kept output rows gets an ``end``
made from its row.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import orjson

from agentlife._exceptions import ConfigError, JobNotFound
from agentlife._output._events import EventKind, JobEvent, cursor_for, parse_cursor
from agentlife.stores._jobs import TERMINAL
from agentlife.stores._prune import pruned_message

if TYPE_CHECKING:
    from agentlife.stores._output import OutputRow
    from agentlife.stores._roles import OperatorStore

__all__ = ["JobFollower", "follow_job"]

_log = logging.getLogger("agentlife.output")
#: Rows read per statement.
_PAGE = 500


def follow_job(
    store: OperatorStore, job_id: str, after: str | None = None, *, live: bool = True
) -> JobFollower:
    """The events of ``job_id``'s output after the cursor ``after`` (None: from its first).

    Use it as ``async with follow_job(store, job_id, after) as events: async for event in events: ...``
    (leaving the block closes what it holds), or iterate it directly. With ``live`` it waits for new
    events and yields model text deltas as they stream, and ends after the job's end event; without, it
    ends after the last event written so far.

    Raises:
        ConfigError: at once, ``after`` is not a cursor of this job (another job's, malformed or forged);
            from the first iteration, it is past the job's last event.
        JobNotFound: from the first iteration, there is no such job.
    """
    return JobFollower(store, job_id, after, live=live)


class JobFollower:
    """The async iterator `follow_job` returns (also an async context manager that closes it)."""

    def __init__(self, store: OperatorStore, job_id: str, after: str | None, *, live: bool) -> None:
        if not isinstance(job_id, str) or not job_id:
            raise ConfigError("follow a job by its id, a non-empty string")
        self.job_id = job_id
        self._seq = 0 if after is None else parse_cursor(job_id, after)  # a bad cursor fails here, at once
        self._store = store
        self._live = live
        self._events: AsyncGenerator[JobEvent, None] = self._run()

    @property
    def cursor(self) -> str:
        """The cursor of the last durable event yielded (where a rejoin goes on)."""
        return cursor_for(self.job_id, self._seq)

    def __aiter__(self) -> AsyncIterator[JobEvent]:
        return self

    async def __anext__(self) -> JobEvent:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        """Stop following: the watch (and, last of the process's, its connection) is released."""
        await self._events.aclose()

    async def __aenter__(self) -> JobFollower:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _run(self) -> AsyncGenerator[JobEvent, None]:
        store, job_id = self._store, self.job_id
        async with store.output_watch(job_id) as watch:
            head = await store.output_head(job_id)
            if head is None:
                raise JobNotFound(pruned_message(job_id, await store.pruned_job(job_id)))
            if self._seq > head:
                raise ConfigError(
                    f"cursor {self.cursor!r} is past job {job_id}'s last event ({head}):"
                    " not one of its cursors"
                )
            moved, ended, checked = True, False, False
            batches: list[bytes] = []
            while True:
                for batch in batches:  # text that came before the rows the next read finds
                    delta = _delta(job_id, self.cursor, batch)
                    if delta is not None:
                        yield delta
                rows = await store.read_output(job_id, self._seq, _PAGE)
                for row in rows:
                    event = _event(job_id, row)
                    if event is not None and event.kind == "end":
                        for batch in await watch.pending():  # the reply's last text, before the end
                            delta = _delta(job_id, self.cursor, batch)
                            if delta is not None:
                                yield delta
                    self._seq = row.seq
                    if event is not None:
                        ended = event.kind == "end"
                        yield event
                if len(rows) == _PAGE:
                    continue
                if ended:
                    return  # the end is the last row: the job is over
                if not rows and not checked:
                    # Caught up for the first time: a job already over (rejoined at its end, or ended before
                    # its store kept output rows) ends here rather than waiting for ever.
                    checked = True
                    over = await self._over()
                    if over is True:
                        continue  # rows came meanwhile (its end among them): read them
                    if over is not None:
                        if over is not False:
                            yield over
                        return
                if not self._live:
                    return
                moved = bool(rows)
                batches = await watch.wait(moved)

    async def _over(self) -> JobEvent | bool | None:
        """Whether the job is over, for a follower that caught up.

        None: the job goes on. True: it is over and rows came after the last read. False: it is over, the
        follower has seen its end. Else the ``end`` of a job that ended before its store kept output rows,
        made from its row.
        """
        row = await self._store.get_job(self.job_id)
        if row is None or row.status not in TERMINAL:
            return None
        if await self._store.read_output(self.job_id, self._seq, 1):
            return True
        if self._seq > 0:
            return False  # rejoined at its end (or past the last event a retried job ended with)
        value = {"status": str(row.status), "attempt": row.attempt}
        return JobEvent(self.job_id, self.cursor, "end", str(row.status), value, row.updated_at or 0.0)


def _event(job_id: str, row: OutputRow) -> JobEvent | None:
    """The event of an output row, or None for a row this version cannot read (passed over, logged)."""
    if row.kind == "unreadable":
        return None
    value: Any = None
    if row.value is not None:
        try:
            value = orjson.loads(row.value)
        except orjson.JSONDecodeError:
            _log.warning("job %s: output row %s holds no JSON value; passed over", job_id, row.seq)
            return None
    kind: EventKind
    if row.kind == "published":
        kind = "published"
    elif row.kind == "status":
        kind = "status"
    elif row.kind == "end":
        kind = "end"
    else:
        return None
    return JobEvent(job_id, cursor_for(job_id, row.seq), kind, row.name, value, row.at)


def _delta(job_id: str, cursor: str, batch: bytes) -> JobEvent | None:
    """A delta event from a batch's JSON: ``{"c": call, "t": text, "d": dropped, "r": restart, "at": t}``."""
    try:
        data = orjson.loads(batch)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("t"), str):
        return None
    call, dropped, at = data.get("c"), data.get("d"), data.get("at")
    value = {
        "call": call if isinstance(call, str) else None,
        "text": data["t"],
        "dropped": dropped if isinstance(dropped, int) and not isinstance(dropped, bool) else 0,
        "restart": data.get("r") is True,
    }
    when = float(at) if isinstance(at, int | float) and not isinstance(at, bool) else 0.0
    return JobEvent(job_id, cursor, "delta", "text", value, when)
