"""The checkpoint document: what a step loop needs to resume exactly where it stopped."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import orjson

from agentlife._exceptions import CheckpointCorrupt

__all__ = ["CheckpointDoc", "Phase"]

#: ``running``: steps remain; ``delivering``: the work is done, delivery is pending;
#: ``awaiting_approval``: parked until a restricted call is approved; ``waiting``: parked at a durable wait
#: (``ctx.sleep``) whose start the journal holds; ``done``: nothing left to do.
Phase = Literal["running", "delivering", "awaiting_approval", "waiting", "done"]


@dataclass(frozen=True, slots=True)
class CheckpointDoc:
    """Saved after every completed step; its exact bytes are what the store CRCs."""

    next_step: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    phase: Phase = "running"
    result: Any = None
    status: str | None = None
    reason: str | None = None
    approved: bool = False
    attempt: int = 1
    written_at: float = 0.0
    #: ``{"length": n, "digest": ...}`` of ``ctx.conversation`` (its messages are rows of their own).
    conversation: dict[str, Any] | None = None

    def encode(self) -> bytes:
        """Serialise to the bytes stored (orjson; the state must be JSON-serialisable)."""
        try:
            return orjson.dumps(
                {
                    "v": 1,
                    "next_step": self.next_step,
                    "state": self.state,
                    "phase": self.phase,
                    "result": self.result,
                    "status": self.status,
                    "reason": self.reason,
                    "approved": self.approved,
                    "attempt": self.attempt,
                    "written_at": self.written_at or time.time(),
                    **({"conversation": self.conversation} if self.conversation else {}),
                },
                option=orjson.OPT_NON_STR_KEYS,
            )
        except TypeError as exc:
            raise TypeError(f"ctx.state must be JSON-serialisable to be checkpointed: {exc}") from exc

    @classmethod
    def decode(cls, data: bytes, job_id: str) -> CheckpointDoc:
        """Parse stored bytes (already CRC-verified); a document we cannot read is corrupt."""
        try:
            raw = orjson.loads(data)
            if not isinstance(raw, dict) or not isinstance(raw.get("state"), dict):
                raise TypeError("not a checkpoint object")
            return cls(
                next_step=int(raw["next_step"]),
                state=raw["state"],
                phase=raw.get("phase", "running"),
                result=raw.get("result"),
                status=raw.get("status"),
                reason=raw.get("reason"),
                approved=bool(raw.get("approved", False)),
                attempt=int(raw.get("attempt", 1)),
                written_at=float(raw.get("written_at", 0.0)),
                conversation=_conversation_meta(raw.get("conversation")),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointCorrupt(f"checkpoint of job {job_id} is not readable: {exc}") from None

    def evolve(self, **changes: Any) -> CheckpointDoc:
        """A copy with ``changes``."""
        return replace(self, **changes)


def _conversation_meta(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("length"), int) or raw["length"] < 0:
        raise TypeError("its conversation entry is not {length, digest}")
    return {"length": raw["length"], "digest": str(raw.get("digest", ""))}
