"""The console's job page shows a job's concurrency key (masked, escaped) and priority."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agentlife._console._data import load_job
from agentlife._console._render import job_page
from agentlife._console._timeline import Timeline
from agentlife._jobs._mask import masker_for
from agentlife.stores import SQLiteStore

pytestmark = pytest.mark.anyio

SECRET = "sk-ant-api03-" + "x" * 40


async def test_the_job_page_shows_the_key_masked_and_escaped_and_the_priority(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentlife.db'}"
    store = SQLiteStore(tmp_path / "agentlife.db")
    await store.open()
    try:
        await store.create_job("j1", "agent-a", None, concurrency_key="<b>acme</b>&co", priority=-3)
        await store.create_job("j2", "agent-a", None, concurrency_key=f"tenant {SECRET}")
        masker = masker_for({}, url)
        now = time.time()
        view = await load_job(store, "j1", tmp_path, masker, now)
        assert view is not None
        page = job_page(view, Timeline(), actions=False, flash=None, now=now)
        assert "<dt>Concurrency key</dt><dd>&lt;b&gt;acme&lt;/b&gt;&amp;co</dd>" in page
        assert "<dt>Priority</dt><dd>-3</dd>" in page
        secret = await load_job(store, "j2", tmp_path, masker, now)
        assert secret is not None
        page = job_page(secret, Timeline(), actions=False, flash=None, now=now)
        assert SECRET not in page and "<dt>Concurrency key</dt><dd>tenant " in page
    finally:
        await store.close()
