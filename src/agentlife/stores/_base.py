"""The `CheckpointStore` protocol and the records it returns (DESIGN §5)."""

from __future__ import annotations

import enum
import logging
import zlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentlife._exceptions import CheckpointCorrupt, ConfigError

__all__ = [
    "HISTORY_KEEP",
    "CheckpointStore",
    "JobRecord",
    "JobStatus",
    "LoadedCheckpoint",
    "TableNames",
    "add_usage_totals",
    "crc32",
    "first_valid_checkpoint",
]

#: How many checkpoints per job `checkpoint_history` keeps.
HISTORY_KEEP = 5


class JobStatus(enum.StrEnum):
    """The job row's ``status`` column."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    WAITING_FOR_APPROVAL = "WAITING_FOR_APPROVAL"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    DEAD_LETTER = "DEAD_LETTER"
    RETRYING = "RETRYING"


def crc32(data: bytes) -> int:
    """CRC-32 of the exact stored bytes, as an unsigned 32-bit integer."""
    return zlib.crc32(data) & 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class TableNames:
    """Table names, configurable to fit an existing control-plane schema."""

    job: str = "job"
    checkpoint_history: str = "checkpoint_history"
    delivery: str = "delivery"

    def __post_init__(self) -> None:
        for name in (self.job, self.checkpoint_history, self.delivery):
            # Names are interpolated into SQL, so only plain (optionally schema-qualified) identifiers pass.
            parts = name.split(".")
            if not (1 <= len(parts) <= 2) or not all(p.isidentifier() and p.isascii() for p in parts):
                raise ConfigError(f"table name {name!r} is not a plain SQL identifier")


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A snapshot of one job row."""

    id: str
    agent_id: str
    status: str
    payload: Any
    attempt: int
    checkpoint_id: str | None = None
    checkpoint_crc: int | None = None
    heartbeat_at: float | None = None
    tokens_consumed: dict[str, Any] = field(default_factory=dict)
    token_budget: dict[str, Any] | None = None
    error: list[dict[str, Any]] = field(default_factory=list)
    result: Any = None
    updated_at: float | None = None


@dataclass(frozen=True, slots=True)
class LoadedCheckpoint:
    """A checkpoint that passed its CRC check; ``source`` says whether history had to be used."""

    checkpoint_id: str
    data: bytes
    crc: int
    source: str  # "job" or "history"
    step: int | None = None


@runtime_checkable
class CheckpointStore(Protocol):
    """Durable job state. Every write after `claim` is fenced by the process's attempt.

    A write whose ``attempt`` no longer owns the row raises `agentlife.AttemptFenced` and changes nothing.
    Implementations: `SQLiteStore` (embedded default) and `PostgresStore` (asyncpg pool).
    """

    url_scheme: str

    async def open(self) -> None:
        """Connect; raise `agentlife.StoreUnavailable` when the store cannot be reached."""

    async def close(self) -> None:
        """Release connections; safe to call twice and after a failed `open`."""

    async def init_schema(self) -> None:
        """Create the tables if they do not exist (``python -m agentlife db init``)."""

    async def get_job(self, job_id: str) -> JobRecord | None:
        """The job row, or None."""

    async def create_job(
        self, job_id: str, agent_id: str, payload: Any, token_budget: dict[str, Any] | None = None
    ) -> JobRecord:
        """Insert a PENDING job row (no-op returning the row if it exists)."""

    async def claim(self, job_id: str, attempt: int) -> JobRecord:
        """Take ownership: set ``attempt`` and status RUNNING when ``attempt`` >= the row's.

        Raises:
            JobNotFound: no such row.
            AttemptFenced: the row belongs to a later attempt.
        """

    async def load_checkpoint(self, job_id: str) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies, falling back to history; None for a fresh job.

        Raises:
            CheckpointCorrupt: a checkpoint exists but neither it nor any history entry verifies.
        """

    async def write_checkpoint(
        self, job_id: str, attempt: int, checkpoint_id: str, step: int, data: bytes
    ) -> int:
        """Store ``data`` exactly, with its CRC-32, and append it to history; returns the CRC."""

    async def set_status(
        self,
        job_id: str,
        attempt: int,
        status: str,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        """Record a status (and result, or a crash record appended to ``error``)."""

    async def add_usage(
        self, job_id: str, attempt: int, input_tokens: int, output_tokens: int, cost_usd: float
    ) -> dict[str, Any]:
        """Add to ``tokens_consumed`` and return the new totals."""

    async def heartbeat(self, job_id: str, attempt: int) -> None:
        """Set ``heartbeat_at`` to now."""

    async def is_delivered(self, key: str) -> bool:
        """Whether the delivery registry holds ``key``."""

    async def record_delivery(self, key: str, job_id: str, channel: str) -> None:
        """Record ``key`` as delivered (idempotent)."""

    def has_free_connection(self) -> bool:
        """Liveness signal: False when every pooled connection is taken (called from the probe thread)."""


def first_valid_checkpoint(job_id: str, history: list[tuple[Any, ...]]) -> LoadedCheckpoint:
    """Log the mismatch and return the newest history entry that verifies, else raise."""
    logging.getLogger("agentlife.store").error(f"Checkpoint CRC mismatch for job {job_id}")
    for checkpoint_id, data, crc, step in history:
        if crc32(bytes(data)) == crc:
            return LoadedCheckpoint(checkpoint_id, bytes(data), crc, "history", step)
    raise CheckpointCorrupt(f"Checkpoint CRC mismatch for job {job_id}: no valid checkpoint in history")


def add_usage_totals(
    totals: dict[str, Any], input_tokens: int, output_tokens: int, cost_usd: float
) -> dict[str, Any]:
    """``tokens_consumed`` after adding one call's usage."""
    return {
        "input": int(totals.get("input", 0)) + input_tokens,
        "output": int(totals.get("output", 0)) + output_tokens,
        "cost_usd": round(float(totals.get("cost_usd", 0.0)) + cost_usd, 6),
    }
