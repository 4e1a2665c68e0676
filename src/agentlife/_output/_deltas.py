"""`DeltaBuffer`: a streaming step's model text, handed to its followers in batches, never slowing the step.

The stream's tap calls `DeltaBuffer.add` for each text delta, synchronously and cheaply (an append and a
count): it never waits. `DeltaBuffer.run`, a task of the job, sends what was added every
`OUTPUT_DELTA_FLUSH_SECONDS` as one store write (PostgreSQL: ``NOTIFY`` payloads; SQLite: its ring of
recent batches), however many followers there are. It skips a round while the store has no free
connection (the step's own writes come first) and while the previous send has not returned.

Bounded: at most `OUTPUT_DELTA_BYTES_PER_SECOND` of text per job (a token bucket holding one second's
worth); text past it is dropped and counted, and the next batch says how many bytes were left out
(``dropped``); a batch that follows a retry of the model call says the text starts over (``restart``).
Each batch's JSON stays under PostgreSQL's 8000-byte ``NOTIFY`` limit (long text is cut into several).
Secrets are masked as everywhere else; so that a secret cut across two deltas is masked whole, each
call's text holds back what could still grow into one (`agentlife._redact.Redactor.split_point`: the word
being written, a secret-shaped run, the start of a known secret) until more text comes or the call ends
(`DeltaBuffer.finish`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import anyio
import orjson

from agentlife.constants import OUTPUT_DELTA_BYTES_PER_SECOND, OUTPUT_DELTA_FLUSH_SECONDS

if TYPE_CHECKING:
    from agentlife._redact import Redactor

__all__ = ["MAX_CHUNK_CHARS", "MAX_HELD_CHARS", "DeltaBuffer"]

_log = logging.getLogger("agentlife.output")
#: A call's held text past this goes anyway, masked as it stands (a secret-shaped run that never ends holds
#: nothing for ever, and each batch scans at most this much for secrets).
MAX_HELD_CHARS = 4096
#: Characters of text per batch: 6 bytes of JSON each at worst (``\\u001f``), well under 8000 with the rest.
MAX_CHUNK_CHARS = 1000


class DeltaBuffer:
    """One job's model text on its way to the followers (see the module).

    Args:
        send: the store write of a list of batches (``store.send_deltas`` bound to the job).
        redactor: masks secrets in each batch.
        can_send: whether the store could take a statement now.
        rate: bytes of text per second, at most.
        interval: seconds between sends.
        clock: monotonic seconds (a test's).
    """

    def __init__(
        self,
        send: Callable[[Sequence[str]], Awaitable[None]],
        redactor: Redactor | None = None,
        *,
        can_send: Callable[[], bool] = lambda: True,
        rate: int = OUTPUT_DELTA_BYTES_PER_SECOND,
        interval: float = OUTPUT_DELTA_FLUSH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send = send
        self._redactor = redactor
        self._can_send = can_send
        self._rate = max(0, rate)
        self._interval = interval
        self._clock = clock
        self._allowance = float(self._rate)
        self._last = clock()
        self._pending: list[tuple[str, str, bool, bool]] = []  # (call, text, starts over, call ended)
        self._held: dict[str, str] = {}  # call -> the tail of its text not yet sent (not masked yet)
        # Calls whose text this process has sent: the first batch of any other says "starts over", since
        # an attempt before this one (killed mid-reply, on any pod) may have streamed the same call.
        self._seen: set[str] = set()
        self._pending_bytes = 0  # at most two seconds' worth while the store takes nothing
        self._dropped_since = 0  # bytes left out since the last batch that went
        #: Bytes of text dropped over the rate, in all.
        self.dropped = 0
        #: Batches sent, and store writes made (one per round that sent any).
        self.batches_sent = 0
        self.writes = 0
        #: Sends that failed (the text they held is lost: deltas are not durable).
        self.failures = 0
        self._sending = anyio.Lock()  # one send at a time: batches reach the store in order

    def restart(self, call: str) -> None:
        """The model call ``call`` is tried again: its text starts over (the next batch says so)."""
        self._seen.add(call)
        self._pending.append((call, "", True, False))

    def finish(self, call: str) -> None:
        """The model call ``call`` ended: what it held back goes with the next batch."""
        if call in self._held or any(entry[0] == call for entry in self._pending):
            self._pending.append((call, "", False, True))

    def add(self, call: str, text: str) -> None:
        """Take a text delta of the model call ``call`` (its invocation id); never waits."""
        if not text:
            return
        size = len(text.encode("utf-8", "surrogatepass"))
        now = self._clock()
        self._allowance = min(float(self._rate), self._allowance + (now - self._last) * self._rate)
        self._last = now
        if size > self._allowance or self._pending_bytes + size > 2 * self._rate:
            self.dropped += size
            self._dropped_since += size
            return
        self._allowance -= size
        self._pending_bytes += size
        if call not in self._seen:  # the call's first text in this process: followers clear what they had
            self._seen.add(call)
            self._pending.append((call, text, True, False))
        elif self._pending and self._pending[-1][0] == call and not self._pending[-1][3]:
            last = self._pending[-1]
            self._pending[-1] = (call, last[1] + text, last[2], False)
        else:
            self._pending.append((call, text, False, False))

    def take(self) -> list[str]:
        """The batches to send now (JSON text each), emptying the buffer."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if not pending and not self._dropped_since:
            return []
        at = round(time.time(), 3)
        batches: list[str] = []
        for call, text, restart, ended in pending or [("", "", False, False)]:
            if restart:
                self._held.pop(call, None)  # the call starts over: its old tail never goes
            raw = self._held.pop(call, "") + text.encode("utf-8", "replace").decode()  # no lone surrogate
            raw, kept = self._split(raw, ended)
            if kept:
                self._held[call] = kept
            clean = raw if self._redactor is None else self._redactor.redact(raw)
            if not clean and not restart and not self._dropped_since and call:
                continue
            for start in range(0, max(len(clean), 1), MAX_CHUNK_CHARS):
                piece = clean[start : start + MAX_CHUNK_CHARS]
                data = {"c": call, "t": piece, "d": self._dropped_since, "r": restart, "at": at}
                self._dropped_since, restart = 0, False
                batches.append(orjson.dumps(data).decode())
        return batches

    def _split(self, raw: str, ended: bool) -> tuple[str, str]:
        """What of a call's unsent text goes now, and what it holds back (unmasked, for the next batch)."""
        if ended or self._redactor is None or len(raw) > MAX_HELD_CHARS:
            return raw, ""  # a run longer than this goes masked as it stands: its tail reads as no secret
        cut = self._redactor.split_point(raw)
        return raw[:cut], raw[cut:]

    async def flush(self) -> None:
        """Send what is buffered now, in one store write (a failure is counted, logged once, not raised)."""
        async with self._sending:
            await self._flush()

    async def _flush(self) -> None:
        batches = self.take()
        if not batches:
            return
        try:
            await self._send(batches)
        except Exception as exc:
            self.failures += 1
            if self.failures == 1:
                _log.warning(
                    "model text for followers not sent (%s); later text still goes", type(exc).__name__
                )
            return
        self.batches_sent += len(batches)
        self.writes += 1

    async def run(self) -> None:
        """Send the buffer every interval while the job runs (a task of the job; cancelled at its end)."""
        while True:
            await anyio.sleep(self._interval)
            if (self._pending or self._dropped_since) and self._can_send():
                await self.flush()
