"""Memory: the hashing embedder and `QdrantMemory` on the real qdrant-client (local mode, dead servers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agentlife._memory import (
    Embedder,
    HashingEmbedder,
    QdrantMemory,
    collection_name,
)


def local(tmp_path: Path, embedder: Embedder | None = None, name: str = "reviewer") -> QdrantMemory:
    return QdrantMemory(
        url=None, path=tmp_path / "qdrant", collection=collection_name(name), embedder=embedder
    )


# -- embedder ------------------------------------------------------------------------------------------------


def test_hashing_embedder_is_the_same_in_another_process() -> None:
    code = "from agentlife._memory import HashingEmbedder as H; print(H(32).embed(['same text here'])[0])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(HashingEmbedder(32).embed(["same text here"])[0])


def test_importing_the_modules_does_not_import_qdrant_client() -> None:
    code = (
        "import sys, agentlife._memory, agentlife._journal._writer, agentlife._journal._show; "
        "print('qdrant_client' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# -- Qdrant, local mode --------------------------------------------------------------------------------------


def test_the_first_search_does_not_block_the_event_loop(tmp_path: Path) -> None:
    """In a fresh interpreter the first call imports qdrant_client (over a second); the loop keeps ticking."""
    code = f"""
import time, anyio
from pathlib import Path
from agentlife._memory import QdrantMemory

async def main():
    gaps, done = [], False
    async def ticker():
        last = time.monotonic()
        while not done:
            await anyio.sleep(0.01)
            now = time.monotonic(); gaps.append(now - last); last = now
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        started = time.monotonic()
        memory = QdrantMemory(url=None, path=Path({str(tmp_path / "q")!r}), collection="c")
        await memory.search("hello")
        await memory.aclose()
        took = time.monotonic() - started
        done = True
    print(f"{{took:.3f}} {{max(gaps):.3f}}")

anyio.run(main)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    took, worst_gap = map(float, out.stdout.split())
    assert worst_gap < max(0.5, took / 2), (took, worst_gap)
