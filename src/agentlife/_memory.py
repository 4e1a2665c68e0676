"""Long-term memory: an `Embedder` and a Qdrant collection per agent, re-ranked by age.

`HashingEmbedder` is the offline default: feature hashing of word unigrams and bigrams, deterministic
across processes and machines, no model download. `QdrantMemory` stores one point per memory text in the
collection of an agent, in Qdrant's local embedded mode under the data dir (``{data_dir}/qdrant``) or on
a server (``AGENTLIFE_QDRANT_URL``). ``qdrant_client`` is imported lazily, on a worker thread, and every
call into it runs on a worker thread too: local mode is synchronous and its import alone takes over a
second, neither of which may block the event loop.

Ranking: ``score = max(similarity, 0) * 0.5 ** (age_days / half_life_days)``: a memory loses half its
weight every ``half_life_days`` (30 by default), so of two equally similar memories the newer ranks
first, and an old memory needs to be clearly more relevant to beat a fresh one.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import anyio
import anyio.to_thread

from agentlife._exceptions import MemoryUnavailable, describe_error
from agentlife.constants import HydrationConstants

__all__ = [
    "DEFAULT_HALF_LIFE_DAYS",
    "Embedder",
    "HashingEmbedder",
    "MemoryRecord",
    "MemoryUnavailable",
    "QdrantMemory",
    "collection_name",
    "decay_score",
    "memory_id",
]

#: Default half-life of a memory's weight in the ranking, in days.
DEFAULT_HALF_LIFE_DAYS = 30.0
_SECONDS_PER_DAY = 86_400.0
_WORD = re.compile(r"\w+", re.UNICODE)
_EMPTY_TOKEN = "\x00empty"
_ID_NAMESPACE = uuid.UUID("6f1c2b7e-2d4a-4f0e-9c1b-a9e5d1f0c3b7")

_T = TypeVar("_T")


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors of a fixed ``dimension``; called on a worker thread, so it may block."""

    @property
    def dimension(self) -> int:
        """The length of every vector."""
        ...

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector of length ``dimension`` per text, in order."""
        ...


@dataclass(frozen=True, slots=True)
class HashingEmbedder:
    """Deterministic offline embedder: signed feature hashing of lower-cased word unigrams and bigrams.

    Each token is hashed with BLAKE2b (stable across processes, unlike ``hash()``) to a bucket and a
    sign; bigrams weigh half as much as words; the vector is L2-normalised, so Qdrant's cosine similarity
    measures shared vocabulary. An empty text maps to a fixed non-zero vector.

    Example:
        >>> e = HashingEmbedder(dimension=64)
        >>> v = e.embed(["kubectl apply failed"])[0]
        >>> len(v), round(sum(x * x for x in v), 6)
        (64, 1.0)
    """

    dimension: int = 256
    """The length of every vector (the Qdrant collection's size); at least 1."""
    bigram_weight: float = 0.5
    """How much a pair of adjacent words counts against a single word (1.0)."""

    def __post_init__(self) -> None:
        if self.dimension < 1:
            raise ValueError(f"dimension must be >= 1, got {self.dimension}")

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One L2-normalised vector per text."""
        return [self._embed_one(text) for text in texts]

    def _embed_one(self, text: str) -> list[float]:
        vector = [0.0] * self.dimension
        words = _WORD.findall(text.lower())
        tokens: list[tuple[str, float]] = [(w, 1.0) for w in words]
        tokens += [(f"{a} {b}", self.bigram_weight) for a, b in itertools.pairwise(words)]
        if not tokens:
            tokens = [(_EMPTY_TOKEN, 1.0)]
        for token, weight in tokens:
            digest = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "big")
            sign = 1.0 if digest >> 63 else -1.0
            vector[digest % self.dimension] += sign * weight
        norm = math.sqrt(sum(x * x for x in vector))
        if norm == 0.0:  # signed tokens cancelled out; a zero vector has no cosine, so pick a fixed one
            vector[0], norm = 1.0, 1.0
        return [x / norm for x in vector]


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    """One memory as returned by `QdrantMemory.search`."""

    id: str
    """The point id (a UUID derived from the text)."""
    text: str
    """The memory."""
    score: float
    """The ranking score, similarity decayed by age."""
    created_at: float
    """When it was written (unix seconds)."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """What was stored with it (job id, agent id, ...)."""
    similarity: float = 0.0
    """The raw cosine similarity to the query."""


def decay_score(similarity: float, age_seconds: float, half_life_days: float) -> float:
    """``max(similarity, 0) * 0.5 ** (age_days / half_life_days)``; a future timestamp counts as age 0."""
    if half_life_days <= 0:
        raise ValueError(f"half_life_days must be > 0, got {half_life_days}")
    age_days = max(age_seconds, 0.0) / _SECONDS_PER_DAY
    weight: float = 0.5 ** (age_days / half_life_days)
    return max(similarity, 0.0) * weight


def collection_name(agent_id: str) -> str:
    """The collection holding an agent's memories: ``agentlife_memory_{agent_id}``."""
    return f"agentlife_memory_{agent_id}"


def memory_id(collection: str, text: str) -> str:
    """The point id of ``text``: a UUID5, so storing a memory twice refreshes it instead of duplicating it."""
    return str(uuid.uuid5(_ID_NAMESPACE, f"{collection}\n{text}"))


class QdrantMemory:
    """An agent's memories in a Qdrant collection, searched with time decay.

    With ``url`` the Qdrant server is used (every request bounded by ``timeout`` seconds); without it,
    Qdrant's local embedded mode stores the collection under ``path``. Local mode takes an exclusive lock
    on ``path``: a second process (or instance) gets `MemoryUnavailable` saying so. The collection is
    created on first use with the embedder's dimension.

    Every call runs on a worker thread and is bounded by ``timeout`` (server) or local disk speed, so a
    cancel scope around it (the runtime's 10 s memory timeout) takes effect once the call returns.
    Calls are serialised: qdrant-client's local mode is not safe for concurrent use.

    Example:
        >>> async def demo(data_dir):
        ...     memory = QdrantMemory(url=None, path=data_dir / "qdrant", collection="agentlife_memory_x")
        ...     try:
        ...         await memory.add(["the staging cluster needs --context=staging"], {"job_id": "j-1"})
        ...         return await memory.search("deploy to staging", top_k=3)
        ...     finally:
        ...         await memory.aclose()
    """

    def __init__(
        self,
        *,
        url: str | None,
        path: Path,
        collection: str,
        embedder: Embedder | None = None,
        timeout: float = 5.0,
        half_life_days: float = DEFAULT_HALF_LIFE_DAYS,
        candidates_factor: int = 4,
        api_key: str | None = None,
    ) -> None:
        if half_life_days <= 0:
            raise ValueError(f"half_life_days must be > 0, got {half_life_days}")
        self.url = url
        self.path = Path(path)
        self.collection = collection
        self.embedder: Embedder = embedder if embedder is not None else HashingEmbedder()
        self.timeout = timeout
        self.half_life_days = half_life_days
        self.candidates_factor = max(1, candidates_factor)
        self._api_key = api_key
        self._client: Any = None
        self._collection_ready = False
        self._closed = False
        # Held by whichever worker thread is inside qdrant-client; one call at a time.
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        """Where the memories live, for log lines (never includes the API key)."""
        return f"qdrant server {self.url}" if self.url else f"qdrant local storage {self.path}"

    # -- public API ------------------------------------------------------------------------------------------

    async def search(
        self,
        query: str,
        top_k: int = HydrationConstants().memory_top_k,
        half_life_days: float | None = None,
        *,
        now: float | None = None,
    ) -> list[MemoryRecord]:
        """The ``top_k`` memories most relevant to ``query``, best first, ranked by `decay_score`.

        ``top_k * candidates_factor`` nearest points are fetched by similarity, then re-ranked by age;
        points with no positive similarity (nothing in common with the query) are left out.

        Raises:
            MemoryUnavailable: the store is unreachable, too slow, locked or misconfigured.
        """
        if top_k < 1:
            return []
        half_life = self.half_life_days if half_life_days is None else half_life_days
        if half_life <= 0:
            raise ValueError(f"half_life_days must be > 0, got {half_life}")
        points = await self._run(self._search_sync, query, top_k * self.candidates_factor)
        at = time.time() if now is None else now
        records = [_to_record(point, at, half_life) for point in points]
        records = [r for r in records if r.similarity > 0.0]  # nothing in common with the query
        records.sort(key=lambda r: (-r.score, -r.created_at, r.id))
        return records[:top_k]

    async def add(
        self,
        texts: Sequence[str],
        metadata: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        created_at: float | None = None,
    ) -> None:
        """Write memories: one point per text, with ``metadata`` (shared, or one mapping per text).

        A text already stored is overwritten, which refreshes its ``created_at``.

        Raises:
            MemoryUnavailable: the store is unreachable, too slow, locked or misconfigured.
            ValueError: a metadata list whose length differs from ``texts``.
        """
        texts = [t for t in texts if isinstance(t, str) and t.strip()]
        if not texts:
            return
        metas = _metadata_list(metadata, len(texts))
        stamp = time.time() if created_at is None else created_at
        await self._run(self._add_sync, texts, metas, stamp)

    async def aclose(self) -> None:
        """Release the client (and local mode's lock); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._client is not None:
            await anyio.to_thread.run_sync(self._close_sync)

    async def __aenter__(self) -> QdrantMemory:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        with anyio.CancelScope(shield=True):
            await self.aclose()

    # -- worker-thread side ----------------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._closed:
            raise MemoryUnavailable(f"{self.where}: the memory client is closed")
        return await anyio.to_thread.run_sync(self._guarded, fn, *args)

    def _guarded(self, fn: Callable[..., _T], *args: Any) -> _T:
        with self._lock:
            try:
                if self._closed:
                    raise MemoryUnavailable(f"{self.where}: the memory client is closed")
                return fn(*args)
            except MemoryUnavailable:
                raise
            except ImportError as exc:
                raise MemoryUnavailable(
                    f"qdrant-client is not installed ({exc}); install agentlife[qdrant]"
                ) from exc
            except Exception as exc:
                raise MemoryUnavailable(f"{self.where}: {_with_cause(exc)}") from exc

    def _connect(self) -> Any:
        if self._client is not None:
            return self._client
        from qdrant_client import QdrantClient

        if self.url:
            self._client = QdrantClient(
                url=self.url,
                api_key=self._api_key,
                timeout=max(1, math.ceil(self.timeout)),
                check_compatibility=False,
            )
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            try:
                # Calls hop between anyio worker threads; _lock serialises them, so sharing is safe.
                self._client = QdrantClient(path=str(self.path), force_disable_check_same_thread=True)
            except RuntimeError as exc:
                if "already accessed" in str(exc):
                    _close_leaked_lock_file(exc)
                    raise MemoryUnavailable(
                        f"qdrant local storage {self.path} is in use by another process or client; "
                        "set AGENTLIFE_QDRANT_URL to share memories through a Qdrant server"
                    ) from exc
                raise
        return self._client

    def _ensure_collection(self, client: Any) -> None:
        if self._collection_ready:
            return
        from qdrant_client import models

        dimension = self.embedder.dimension
        if not client.collection_exists(self.collection):
            client.create_collection(
                self.collection,
                vectors_config=models.VectorParams(size=dimension, distance=models.Distance.COSINE),
            )
        else:
            vectors = client.get_collection(self.collection).config.params.vectors
            size = getattr(vectors, "size", None)
            if size is not None and size != dimension:
                raise MemoryUnavailable(
                    f"{self.where}: collection {self.collection!r} holds vectors of size {size}, "
                    f"but the embedder produces {dimension}; use another collection or embedder"
                )
        self._collection_ready = True

    def _search_sync(self, query: str, limit: int) -> list[Any]:
        client = self._connect()
        self._ensure_collection(client)
        vector = self._embed([query])[0]
        response = client.query_points(self.collection, query=vector, limit=limit, with_payload=True)
        return list(response.points)

    def _add_sync(self, texts: list[str], metas: list[Mapping[str, Any]], created_at: float) -> None:
        from qdrant_client import models

        client = self._connect()
        self._ensure_collection(client)
        vectors = self._embed(texts)
        points = [
            models.PointStruct(
                id=memory_id(self.collection, text),
                vector=vector,
                payload={"text": text, "created_at": created_at, "metadata": dict(meta)},
            )
            for text, vector, meta in zip(texts, vectors, metas, strict=True)
        ]
        client.upsert(self.collection, points=points, wait=True)

    def _embed(self, texts: list[str]) -> list[list[float]]:
        vectors = self.embedder.embed(texts)
        dimension = self.embedder.dimension
        if len(vectors) != len(texts) or any(len(v) != dimension for v in vectors):
            raise MemoryUnavailable(
                f"embedder {type(self.embedder).__name__} returned vectors that do not match "
                f"{len(texts)} texts x dimension {dimension}"
            )
        return vectors

    def _close_sync(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            if client is not None:
                client.close()


def _metadata_list(
    metadata: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None, count: int
) -> list[Mapping[str, Any]]:
    if metadata is None:
        return [{}] * count
    if isinstance(metadata, Mapping):
        return [metadata] * count
    metas = list(metadata)
    if len(metas) != count:
        raise ValueError(f"got {len(metas)} metadata mappings for {count} texts")
    return metas


def _to_record(point: Any, now: float, half_life_days: float) -> MemoryRecord:
    payload = point.payload if isinstance(point.payload, Mapping) else {}
    created = payload.get("created_at")
    created_at = float(created) if isinstance(created, (int, float)) else 0.0
    metadata = payload.get("metadata")
    similarity = float(point.score)
    return MemoryRecord(
        id=str(point.id),
        text=str(payload.get("text", "")),
        score=decay_score(similarity, now - created_at, half_life_days),
        created_at=created_at,
        metadata=metadata if isinstance(metadata, Mapping) else {},
        similarity=similarity,
    )


def _close_leaked_lock_file(exc: BaseException) -> None:
    """Close the lock file qdrant-client leaves open when its local mode finds the storage locked.

    Without this the half-built client's file is only closed by the garbage collector, with a
    ResourceWarning. The file hangs off the client object in the failing frame.
    """
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        lock_file = getattr(owner, "_flock_file", None)
        if lock_file is not None and hasattr(lock_file, "close"):
            lock_file.close()
        tb = tb.tb_next


def _with_cause(exc: BaseException) -> str:
    """One line naming the error and, for a wrapped transport error (qdrant-client's), its cause."""
    text = describe_error(exc)
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" (caused by {describe_error(cause)})"
    return text[:300]
