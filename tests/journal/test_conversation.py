"""``ctx.conversation``: append-only rows beside the checkpoint, rebuilt exactly on resume, on both stores."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlife import AgentProcess, AttemptFenced, CheckpointCorrupt, Done, StepContext, UnreplayableValue
from agentlife._checkpoint import CheckpointDoc
from agentlife._journal._conversation import ConversationLog, rolling_digest
from agentlife.stores import PostgresStore, SQLiteStore
from agentlife.testing import AgentHarness, DrainAt

pytestmark = pytest.mark.anyio


TURN_BYTES = 4096


def turn_messages(step: int) -> list[dict[str, Any]]:
    """Two messages per step, ~4 KB in all, each different."""
    body = f"turn {step} " + "x" * (TURN_BYTES // 2 - 16)
    return [
        {"role": "user", "content": body},
        {"role": "assistant", "content": [{"type": "text", "text": body[::-1]}]},
    ]


def expected_history(steps: int) -> list[dict[str, Any]]:
    return [message for step in range(steps) for message in turn_messages(step)]


class Chatter(AgentProcess):
    """Appends one turn per step; checks at every step that the history is exactly what it appended."""

    agent_id = "chatter"

    def __init__(self, steps: int, *, fail_at: int | None = None) -> None:
        self.steps = steps
        self.fail_at = fail_at
        self.seen: list[int] = []

    async def step(self, ctx: StepContext) -> Done | None:
        assert list(ctx.conversation) == expected_history(ctx.step), f"history differs at step {ctx.step}"
        self.seen.append(ctx.step)
        ctx.conversation.extend(turn_messages(ctx.step))
        if ctx.step == self.fail_at:
            self.fail_at = None
            raise RuntimeError("crash after appending")
        if ctx.step + 1 == self.steps:
            return Done(result={"messages": len(ctx.conversation)})
        return None


@pytest.fixture(params=["sqlite", "postgres"])
async def database_env(request: pytest.FixtureRequest) -> dict[str, str]:
    if request.param == "sqlite":
        return {}
    url = request.getfixturevalue("postgres_url")
    store = PostgresStore(url)
    await store.open()
    await store.init_schema()
    await store.create_job("job-1", Chatter.agent_id, None)
    await store.close()
    return {"AGENTLIFE_DATABASE_URL": url}


async def test_resume_at_turn_150_rebuilds_the_history_exactly(
    tmp_path: Path, database_env: dict[str, str]
) -> None:
    harness = AgentHarness(tmp_path, env=database_env)
    first = Chatter(200)
    run = await harness.run(first, drain=DrainAt.between_steps(149))
    assert run.exit_code == 143, run.log_messages()[-3:]
    assert first.seen[-1] == 149

    second = Chatter(200)
    run = await harness.run(second)
    assert run.exit_code == 0
    assert second.seen[0] == 150  # resumed, and its first step saw the 300 messages of steps 0-149
    assert second.seen[-1] == 199
    rows = await _stored_rows(tmp_path, database_env, "job-1")
    assert [orjson.loads(row) for row in rows] == expected_history(200)


async def test_a_crashed_step_leaves_no_messages_behind(tmp_path: Path) -> None:
    harness = AgentHarness(tmp_path)
    run = await harness.run(Chatter(5, fail_at=2))
    assert run.exit_code != 0
    again = Chatter(5)
    run = await harness.run(again)
    assert run.exit_code == 0
    assert again.seen == [2, 3, 4]  # step 2 saw only steps 0-1: the crashed step's messages are gone
    assert len(await _stored_rows(tmp_path, {}, "job-1")) == 10


async def test_checkpoint_size_does_not_grow_with_the_history(tmp_path: Path) -> None:
    harness = AgentHarness(tmp_path)
    await harness.run(Chatter(2), job_id="short")
    await harness.run(Chatter(200), job_id="long")
    conn = sqlite3.connect(tmp_path / "agentlife.db")
    sizes = dict(conn.execute("SELECT id, length(checkpoint) FROM job").fetchall())
    conn.close()
    # The checkpoint holds the history's length and digest, not the messages: 800 KB of history later it
    # is the same size, give or take the digits of the numbers in it.
    assert sizes["long"] <= sizes["short"] + 16


async def test_a_tampered_history_refuses_to_boot(tmp_path: Path) -> None:
    harness = AgentHarness(tmp_path)
    run = await harness.run(Chatter(10), drain=DrainAt.between_steps(3))
    assert run.exit_code == 143
    conn = sqlite3.connect(tmp_path / "agentlife.db")
    conn.execute(
        "UPDATE conversation SET message = ? WHERE job_id = 'job-1' AND seq = 3",
        (orjson.dumps({"role": "user", "content": "forged"}),),
    )
    conn.commit()
    conn.close()
    again = Chatter(10)
    run = await harness.run(again)
    assert run.exit_code != 0
    assert again.seen == []
    assert any("does not match the checkpoint's digest" in message for message in run.log_messages())


def test_rows_that_match_the_digest_but_are_no_messages_are_refused_too() -> None:
    # Only someone who also rewrote the checkpoint's digest gets here; the refusal is still one line.
    for row in (b"not json{", b"[1]", b'"text"', b"\xff\xfe"):
        meta = {"length": 1, "digest": rolling_digest("", row)}
        with pytest.raises(CheckpointCorrupt, match="stored conversation message 0 is not a JSON object"):
            ConversationLog.restore("j", meta, [row])


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.binary(max_size=64) | st.sampled_from([b"{}", b'{"role":"user"}', b"[]"]), max_size=4)
)
def test_restoring_any_rows_gives_messages_or_checkpoint_corrupt(rows: list[bytes]) -> None:
    digest = ""
    for row in rows:
        digest = rolling_digest(digest, row)
    for meta in ({"length": len(rows), "digest": digest}, {"length": len(rows), "digest": "other"}):
        try:
            log = ConversationLog.restore("j", meta, rows)
        except CheckpointCorrupt:
            continue
        assert all(isinstance(message, dict) for message in log.begin_step())


async def test_missing_rows_refuse_to_boot(tmp_path: Path) -> None:
    harness = AgentHarness(tmp_path)
    await harness.run(Chatter(10), drain=DrainAt.between_steps(3))
    conn = sqlite3.connect(tmp_path / "agentlife.db")
    conn.execute("DELETE FROM conversation WHERE seq >= 6")
    conn.commit()
    conn.close()
    run = await harness.run(Chatter(10))
    assert run.exit_code != 0
    assert any("the store holds 6" in message for message in run.log_messages())


async def test_messages_must_be_exact_json(tmp_path: Path) -> None:
    conversation = ConversationLog().begin_step()
    with pytest.raises(TypeError, match="role"):
        conversation.append({"content": "no role"})
    with pytest.raises(UnreplayableValue):
        conversation.append({"role": "user", "content": float("nan")})
    with pytest.raises(TypeError):
        conversation.append({"role": "user", "content": object()})
    assert len(conversation) == 0 and conversation.new_rows() == []


def test_the_view_reads_committed_then_pending_messages() -> None:
    log = ConversationLog(
        [{"role": "user", "content": "a"}], rolling_digest("", b'{"role":"user","content":"a"}')
    )
    view = log.begin_step()
    view.append({"role": "assistant", "content": "b"})
    assert [m["content"] for m in view] == ["a", "b"]
    assert view[0]["content"] == "a" and view[-1]["content"] == "b" and view[1:][0]["content"] == "b"
    assert view.new_rows() == [(1, b'{"role":"assistant","content":"b"}')]
    assert len(log) == 1  # not committed until the checkpoint is stored
    view.commit()
    assert len(log) == 2 and log.digest == view.meta()["digest"]  # type: ignore[index]
    restored = ConversationLog.restore(
        "j", view.meta(), [b'{"role":"user","content":"a"}', b'{"role":"assistant","content":"b"}']
    )
    assert restored.digest == log.digest


def test_checkpoint_docs_keep_the_conversation_entry() -> None:
    doc = CheckpointDoc(conversation={"length": 3, "digest": "ab"})
    assert CheckpointDoc.decode(doc.encode(), "j").conversation == {"length": 3, "digest": "ab"}
    assert CheckpointDoc.decode(CheckpointDoc().encode(), "j").conversation is None
    with pytest.raises(Exception, match="not readable"):
        CheckpointDoc.decode(b'{"next_step": 1, "state": {}, "conversation": {"length": -1}}', "j")


async def _stored_rows(tmp_path: Path, env: dict[str, str], job_id: str) -> list[bytes]:
    url = env.get("AGENTLIFE_DATABASE_URL")
    store = PostgresStore(url) if url else SQLiteStore(tmp_path / "agentlife.db")
    await store.open()
    try:
        return await store.load_conversation(job_id, 10**6)
    finally:
        await store.close()


async def test_a_fenced_checkpoint_writes_no_messages(tmp_path: Path, database_env: dict[str, str]) -> None:
    url = database_env.get("AGENTLIFE_DATABASE_URL")
    store = PostgresStore(url) if url else SQLiteStore(tmp_path / "agentlife.db")
    await store.open()
    try:
        await store.init_schema()
        await store.create_job("job-1", "chatter", None)
        await store.claim("job-1", 1)
        await store.write_checkpoint("job-1", 1, "c1", 0, b"{}", [(0, b'"a"'), (1, b'"b"')])
        await store.claim("job-1", 2)
        with pytest.raises(AttemptFenced):
            await store.write_checkpoint("job-1", 1, "c2", 1, b"{}", [(2, b'"stale"')])
        await store.write_checkpoint("job-1", 2, "c3", 1, b"{}", [(1, b'"B"'), (2, b'"c"')])
        assert await store.load_conversation("job-1", 10) == [b'"a"', b'"B"', b'"c"']
        assert await store.load_conversation("job-1", 2) == [b'"a"', b'"B"']
        assert await store.load_conversation("other", 10) == []
    finally:
        await store.close()
