"""`Conversation`: the durable, append-only message history of a job (``ctx.conversation``).

The messages a step appends are stored as rows of their own, in the same transaction as the step's
checkpoint; the checkpoint keeps only the history's length and a rolling digest. A checkpoint write at turn
200 therefore costs what it costs at turn 1, and a resumed process reads the rows back, checks the digest,
and hands the step exactly the history it had.

A step sees the history as it was at the step's start plus what it appended; a step that crashes or is
cancelled leaves nothing behind, like ``ctx.state``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from agentlife._exceptions import CheckpointCorrupt
from agentlife._replay import check_replayable

__all__ = ["Conversation", "ConversationLog", "rolling_digest"]

_EMPTY_DIGEST = ""


def rolling_digest(previous: str, message: bytes) -> str:
    """The digest of a history after ``message`` was appended to one whose digest is ``previous``."""
    import hashlib  # at the first model call, not at boot: OpenSSL's start-up costs about 2 ms

    return hashlib.blake2b(previous.encode() + message, digest_size=16).hexdigest()


class ConversationLog:
    """The committed history of one job: what the newest checkpoint covers."""

    def __init__(self, messages: Sequence[dict[str, Any]] = (), digest: str = _EMPTY_DIGEST) -> None:
        self._messages = list(messages)
        self.digest = digest

    def __len__(self) -> int:
        return len(self._messages)

    @classmethod
    def restore(cls, job_id: str, meta: Mapping[str, Any] | None, rows: Sequence[bytes]) -> ConversationLog:
        """Rebuild the history a checkpoint describes from its stored rows, or refuse.

        The digest is checked over the stored bytes before any row is parsed, so a row edited into
        anything at all (not JSON, not a message) is refused like every other tampering.

        Raises:
            CheckpointCorrupt: rows are missing, their digest is not the checkpoint's, or a row that
                matches the digest is not a message object.
        """
        if not meta:
            return cls()
        length, expected = int(meta.get("length", 0)), str(meta.get("digest", ""))
        if len(rows) != length:
            raise CheckpointCorrupt(
                f"job {job_id}: the checkpoint's conversation has {length} messages, "
                f"the store holds {len(rows)}"
            )
        digest = _EMPTY_DIGEST
        for row in rows:
            digest = rolling_digest(digest, row)
        if digest != expected:
            raise CheckpointCorrupt(
                f"job {job_id}: the stored conversation does not match the checkpoint's digest"
            )
        return cls([_message(job_id, seq, row) for seq, row in enumerate(rows)], digest)

    def begin_step(self) -> Conversation:
        """The view one step works on."""
        return Conversation(self)

    def _commit(self, messages: Sequence[dict[str, Any]], digest: str) -> None:
        self._messages.extend(messages)
        self.digest = digest


def _message(job_id: str, seq: int, row: bytes) -> dict[str, Any]:
    """One stored row as a message; only a forger who also rewrote the checkpoint gets past the digest."""
    try:
        message = orjson.loads(row)
    except orjson.JSONDecodeError:
        message = None
    if not isinstance(message, dict):
        raise CheckpointCorrupt(f"job {job_id}: stored conversation message {seq} is not a JSON object")
    return message


class Conversation(Sequence[dict[str, Any]]):
    """``ctx.conversation``: the job's message history, durable across drains and crashes.

    It reads like a list of messages (``{"role": ..., "content": ...}`` dicts, Anthropic-shaped) and grows
    with `append` and `extend` only. What a step appends is saved with the step's checkpoint; until then it
    is visible to this step alone. Pass ``list(ctx.conversation)`` as ``messages`` to ``ctx.llm.complete``.

    Example:
        >>> async def step(self, ctx):
        ...     if not ctx.conversation:
        ...         ctx.conversation.append({"role": "user", "content": ctx.job.payload["question"]})
        ...     reply = await ctx.llm.complete(model=MODEL, max_tokens=1024, messages=list(ctx.conversation))
        ...     ctx.conversation.append({"role": "assistant", "content": list(reply.content)})
    """

    __slots__ = ("_digest", "_log", "_pending", "_rows")

    def __init__(self, log: ConversationLog) -> None:
        self._log = log
        self._pending: list[dict[str, Any]] = []
        self._rows: list[bytes] = []
        self._digest = log.digest

    def __len__(self) -> int:
        return len(self._log) + len(self._pending)

    def __getitem__(self, index: Any) -> Any:
        committed = self._log._messages
        if isinstance(index, int) and 0 <= index < len(committed):
            return committed[index]
        return [*committed, *self._pending][index]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        yield from self._log._messages
        yield from self._pending

    def __repr__(self) -> str:
        return f"Conversation({len(self)} messages, {len(self._pending)} new in this step)"

    def append(self, message: Mapping[str, Any]) -> None:
        """Add a message; it must be JSON made of exact values (it is stored and replayed as such).

        Raises:
            UnreplayableValue: the message holds a value that would not come back the same.
            TypeError: the message is not a mapping with a ``role``.
        """
        if not isinstance(message, Mapping) or "role" not in message:
            raise TypeError("a conversation message is a mapping with a 'role' and a 'content'")
        check_replayable(dict(message), "a conversation message")
        row = orjson.dumps(dict(message))
        copy = orjson.loads(row)
        self._pending.append(copy)
        self._rows.append(row)
        self._digest = rolling_digest(self._digest, row)

    def extend(self, messages: Iterable[Mapping[str, Any]]) -> None:
        """`append` each of ``messages``."""
        for message in messages:
            self.append(message)

    # -- the runtime's side -------------------------------------------------------------------------------

    def new_rows(self) -> list[tuple[int, bytes]]:
        """The rows to store with the step's checkpoint: ``(position, encoded message)``."""
        start = len(self._log)
        return [(start + i, row) for i, row in enumerate(self._rows)]

    def meta(self) -> dict[str, Any] | None:
        """What the step's checkpoint records of the history."""
        if not len(self):
            return None
        return {"length": len(self), "digest": self._digest}

    def commit(self) -> None:
        """The step's checkpoint is stored: its messages join the committed history."""
        self._log._commit(self._pending, self._digest)
        self._pending, self._rows = [], []
