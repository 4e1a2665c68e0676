"""Memory: the hashing embedder and `QdrantMemory` on the real qdrant-client (local mode, dead servers)."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from agentlife._memory import (
    Embedder,
    HashingEmbedder,
    MemoryUnavailable,
    QdrantMemory,
    collection_name,
    decay_score,
    memory_id,
)

DAY = 86_400.0


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


class TableEmbedder:
    """A real `Embedder` with chosen vectors, so two memories can be exactly as similar to a query."""

    dimension = 3

    def __init__(self, table: dict[str, list[float]]) -> None:
        self.table = table

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.table[text] for text in texts]


def local(tmp_path: Path, embedder: Embedder | None = None, name: str = "reviewer") -> QdrantMemory:
    return QdrantMemory(
        url=None, path=tmp_path / "qdrant", collection=collection_name(name), embedder=embedder
    )


# -- embedder ------------------------------------------------------------------------------------------------


def test_hashing_embedder_is_normalised_and_ranks_shared_words_higher() -> None:
    embedder = HashingEmbedder()
    assert isinstance(embedder, Embedder)
    query, near, far, empty = embedder.embed(
        ["deploy the api to staging", "staging deploy of the api failed", "lunch menu for friday", ""]
    )
    assert len(query) == 256
    for vector in (query, near, far, empty):
        assert math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-9)
    assert cosine(query, near) > 0.4
    assert cosine(query, near) > cosine(query, far) + 0.3
    assert embedder.embed(["Deploy, THE api!"]) == embedder.embed(["deploy the API"])


def test_hashing_embedder_refuses_a_bad_dimension() -> None:
    with pytest.raises(ValueError, match="dimension"):
        HashingEmbedder(0)


def test_decay_score_halves_every_half_life() -> None:
    assert decay_score(0.8, 0, 30) == pytest.approx(0.8)
    assert decay_score(0.8, 30 * DAY, 30) == pytest.approx(0.4)
    assert decay_score(0.8, 60 * DAY, 30) == pytest.approx(0.2)
    assert decay_score(0.8, -5 * DAY, 30) == pytest.approx(0.8)  # clock skew: never above the similarity
    assert decay_score(-0.3, 0, 30) == 0.0
    with pytest.raises(ValueError, match="half_life_days"):
        decay_score(1.0, 0, 0)


def test_memory_ids_are_stable_per_collection_and_text() -> None:
    assert memory_id("a", "x") == memory_id("a", "x")
    assert memory_id("a", "x") != memory_id("b", "x")
    assert memory_id("a", "x") != memory_id("a", "y")


# -- Qdrant, local mode --------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_add_then_search_returns_the_relevant_memory_first(tmp_path: Path) -> None:
    async with local(tmp_path) as memory:
        await memory.add(
            [
                "the staging cluster needs the staging kube context before kubectl apply",
                "lunch is served at noon on fridays",
                "rotate the database password every ninety days",
            ],
            {"job_id": "job-1"},
        )
        records = await memory.search("kubectl apply to the staging cluster", top_k=3)
    assert records
    assert records[0].text.startswith("the staging cluster")
    assert records[0].metadata == {"job_id": "job-1"}
    assert records[0].similarity > 0
    assert records[0].score == pytest.approx(records[0].similarity, rel=1e-3)  # written just now
    assert all(a.score >= b.score for a, b in itertools.pairwise(records))
    assert "lunch is served at noon on fridays" not in [r.text for r in records]  # nothing in common


@pytest.mark.anyio
async def test_time_decay_ranks_the_newer_of_two_equally_similar_memories_first(tmp_path: Path) -> None:
    embedder = TableEmbedder(
        {"query": [1, 0, 0], "old fact": [1, 0, 0], "new fact": [1, 0, 0], "far": [0, 1, 0]}
    )
    now = time.time()
    async with local(tmp_path, embedder) as memory:
        await memory.add(["old fact"], created_at=now - 60 * DAY)
        await memory.add(["new fact"], created_at=now - 1 * DAY)
        await memory.add(["far"], created_at=now)
        records = await memory.search("query", top_k=10, now=now)
        slow_decay = await memory.search("query", top_k=10, half_life_days=6000, now=now)
    assert [r.text for r in records] == ["new fact", "old fact"]
    assert records[0].similarity == pytest.approx(records[1].similarity)
    assert records[1].score == pytest.approx(records[1].similarity * 0.25, rel=1e-3)  # two half-lives
    assert slow_decay[1].score == pytest.approx(slow_decay[1].similarity, rel=0.02)


@pytest.mark.anyio
async def test_top_k_is_respected(tmp_path: Path) -> None:
    async with local(tmp_path) as memory:
        await memory.add([f"deploy service number {i} to staging" for i in range(20)])
        records = await memory.search("deploy to staging", top_k=5)
        assert len(records) == 5
        assert len({r.id for r in records}) == 5
        assert len(await memory.search("deploy to staging", top_k=50)) == 20
        assert await memory.search("deploy to staging", top_k=0) == []


@pytest.mark.anyio
async def test_adding_the_same_text_again_refreshes_it(tmp_path: Path) -> None:
    async with local(tmp_path) as memory:
        await memory.add(["the api lives in eu-west-1"], [{"v": 1}], created_at=1000.0)
        await memory.add(["the api lives in eu-west-1"], [{"v": 2}], created_at=2000.0)
        records = await memory.search("where does the api live", top_k=10)
    assert len(records) == 1
    assert records[0].created_at == 2000.0
    assert records[0].metadata == {"v": 2}


@pytest.mark.anyio
async def test_memories_persist_across_clients(tmp_path: Path) -> None:
    async with local(tmp_path) as memory:
        await memory.add(["postgres runs on port 5433 here"])
    async with local(tmp_path) as memory:
        records = await memory.search("postgres port")
    assert [r.text for r in records] == ["postgres runs on port 5433 here"]


@pytest.mark.anyio
async def test_collections_are_per_agent(tmp_path: Path) -> None:
    async with local(tmp_path, name="a") as memory:
        await memory.add(["only agent a knows this"])
    async with local(tmp_path, name="b") as memory:
        assert await memory.search("agent a knows") == []


@pytest.mark.anyio
async def test_local_storage_in_use_is_a_clear_error(tmp_path: Path) -> None:
    first, second = local(tmp_path), local(tmp_path)
    try:
        await first.search("anything")
        with pytest.raises(MemoryUnavailable, match="in use by another process"):
            await second.search("anything")
        await first.aclose()
        await second.add(["after the first one closed"])  # the lock is released on close
    finally:
        await first.aclose()
        await second.aclose()


@pytest.mark.anyio
async def test_a_collection_with_another_dimension_is_refused(tmp_path: Path) -> None:
    async with local(tmp_path) as memory:
        await memory.add(["made with 256 dimensions"])
    async with local(tmp_path, HashingEmbedder(64)) as memory:
        with pytest.raises(MemoryUnavailable, match="size 256"):
            await memory.search("x")


@pytest.mark.anyio
async def test_a_broken_embedder_is_reported(tmp_path: Path) -> None:
    async with local(tmp_path, TableEmbedder({"q": [1.0, 0.0]})) as memory:  # 2 values for dimension 3
        with pytest.raises(MemoryUnavailable, match="dimension 3"):
            await memory.search("q")


@pytest.mark.anyio
async def test_closed_memory_refuses_calls_and_close_is_idempotent(tmp_path: Path) -> None:
    memory = local(tmp_path)
    await memory.add(["x y z"])
    await memory.aclose()
    await memory.aclose()
    with pytest.raises(MemoryUnavailable, match="closed"):
        await memory.search("x")


# -- Qdrant server -------------------------------------------------------------------------------------------


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.anyio
async def test_an_unreachable_server_fails_fast(tmp_path: Path) -> None:
    memory = QdrantMemory(url=f"http://127.0.0.1:{closed_port()}", path=tmp_path, collection="c", timeout=1)
    started = time.monotonic()
    with pytest.raises(MemoryUnavailable, match=r"qdrant server http://127\.0\.0\.1"):
        await memory.search("anything")
    assert time.monotonic() - started < 10
    with pytest.raises(MemoryUnavailable):
        await memory.add(["x"])
    await memory.aclose()


@pytest.mark.anyio
async def test_a_server_that_never_answers_times_out(tmp_path: Path) -> None:
    async def silent(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await anyio.sleep(30)  # accept, read nothing, answer nothing

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, silent)
        memory = QdrantMemory(url=f"http://127.0.0.1:{port}", path=tmp_path, collection="c", timeout=1)
        started = time.monotonic()
        with pytest.raises(MemoryUnavailable, match="qdrant server"):
            await memory.search("anything")
        elapsed = time.monotonic() - started
        await memory.aclose()
        tg.cancel_scope.cancel()
    assert 0.5 < elapsed < 10
