"""A job's output in the store, on SQLite and PostgreSQL: published rows, status rows, one order, deltas.

``raw`` reaches around the store as an operator, a control plane or a torn disk would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from test_store_contract import Backend

from agentlife import AttemptFenced, ConfigError, JobNotFound
from agentlife._output._events import cursor_for
from agentlife._output._follow import follow_job
from agentlife.stores import CheckpointStore, JobStatus, PostgresStore, SQLiteStore, TableNames
from agentlife.stores._output import publish_output

pytestmark = pytest.mark.anyio


class Db:
    def __init__(self, kind: str, location: str) -> None:
        self.kind, self.location = kind, location
        self.opened: list[CheckpointStore] = []

    async def store(self) -> CheckpointStore:
        store: CheckpointStore = (
            SQLiteStore(self.location) if self.kind == "sqlite" else PostgresStore(self.location)
        )
        await store.open()
        await store.init_schema()
        self.opened.append(store)
        return store

    async def raw(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return await Backend(self.kind, self.location, TableNames()).raw(sql, *args)


@pytest.fixture(params=["sqlite", "postgresql"])
async def output_db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Db]:
    location = (
        str(tmp_path / "agentlife.db")
        if request.param == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    made = Db(request.param, location)
    yield made
    for store in reversed(made.opened):
        await store.close()


async def _running(store: CheckpointStore, job_id: str = "job-1", attempt: int = 1) -> None:
    await store.create_job(job_id, "agent-a", None)
    await store.claim(job_id, attempt)


async def _events(store: CheckpointStore, job_id: str, after: str | None = None) -> list[Any]:
    async with follow_job(store, job_id, after, live=False) as events:
        return [event async for event in events]


async def test_published_and_status_rows_share_one_order_and_a_publish_is_kept_once(
    output_db: Db,
) -> None:
    store = await output_db.store()
    await store.init_schema()  # `db init` on a database that has it all: nothing changes, nothing fails
    await _running(store)  # PENDING -> RUNNING: a status row
    assert await store.publish_output("job-1", 1, "job-1/0/0", "phase", b'{"n": 1}') == 2
    # The same call again (a step replayed after a crash, on any pod): its row, not a second one.
    assert await store.publish_output("job-1", 1, "job-1/0/0", "phase", b'{"n": 99}') == 2
    assert await store.publish_output("job-1", 1, "job-1/0/1", "phase", b'"two"') == 3
    await store.set_status("job-1", 1, JobStatus.COMPLETED, result={"ok": True})
    events = await _events(store, "job-1")
    assert [(e.kind, e.name, e.value) for e in events] == [
        ("status", "RUNNING", {"status": "RUNNING", "attempt": 1}),
        ("published", "phase", {"n": 1}),
        ("published", "phase", "two"),
        ("end", "COMPLETED", {"status": "COMPLETED", "attempt": 1}),
    ]
    assert [e.cursor for e in events] == [cursor_for("job-1", n) for n in (1, 2, 3, 4)]
    # Rejoining after any event goes on exactly after it; after the end, nothing (the job is over).
    for index, event in enumerate(events):
        assert await _events(store, "job-1", event.cursor) == events[index + 1 :]


async def test_a_publish_of_an_attempt_that_lost_the_job_or_of_an_ended_job_writes_nothing(
    output_db: Db,
) -> None:
    store = await output_db.store()
    await _running(store)
    with pytest.raises(AttemptFenced):
        await store.publish_output("job-1", 2, "job-1/0/0", "x", b"1")
    other = await output_db.store()  # another process's claim token: fenced though the attempt matches
    with pytest.raises(AttemptFenced):
        await other.publish_output("job-1", 1, "job-1/0/0", "x", b"1")
    await store.set_status("job-1", 1, JobStatus.FAILED)
    with pytest.raises(AttemptFenced):
        await store.publish_output("job-1", 1, "job-1/0/0", "x", b"1")
    assert [e.kind for e in await _events(store, "job-1")] == ["status", "end"]


async def test_past_the_limit_a_publish_is_refused_in_one_line_and_status_rows_still_go_in(
    output_db: Db,
) -> None:
    store = await output_db.store()
    await _running(store)
    run = store._db.run  # type: ignore[attr-defined]
    owner = store.owner  # type: ignore[attr-defined]
    assert await run(publish_output, "job-1", 1, owner, "job-1/0/0", "a", b"1", 3) == 2
    assert await run(publish_output, "job-1", 1, owner, "job-1/0/1", "a", b"1", 3) == 3
    with pytest.raises(ConfigError, match=r"already holds 3 output events \(at most 3\)") as caught:
        await run(publish_output, "job-1", 1, owner, "job-1/0/2", "a", b"1", 3)
    assert "\n" not in str(caught.value)
    await store.set_status("job-1", 1, JobStatus.COMPLETED)  # the end is never refused
    assert [e.kind for e in await _events(store, "job-1")] == ["status", "published", "published", "end"]


async def test_cursors_of_another_job_forged_malformed_or_past_the_end_are_refused(
    output_db: Db,
) -> None:
    store = await output_db.store()
    await _running(store)
    await _running(store, "job-2")
    theirs = (await _events(store, "job-2"))[0].cursor
    bad = [
        (theirs, "not a cursor of job 'job-1'"),
        ("1.0000000000000000", "not a cursor of job 'job-1'"),
        (theirs.replace("1.", "2.", 1), "not a cursor of job 'job-2'"),
        ("", "is not a cursor"),
        ("x" * 10_000, "is not a cursor"),
        ("01." + cursor_for("job-1", 1).split(".")[1], "is not a cursor"),
        ("-1.ab", "is not a cursor"),
        ("\udcff.ab", "is not a cursor"),
        ("9" * 19 + ".ab", "is not a cursor"),
    ]
    for cursor, message in bad:
        job = "job-2" if "job-2" in message else "job-1"
        with pytest.raises(ConfigError, match=message) as caught:
            follow_job(store, job, cursor)
        assert "\n" not in str(caught.value) and len(str(caught.value)) < 200
    with pytest.raises(ConfigError, match="past job job-1's last event"):
        await _events(store, "job-1", cursor_for("job-1", 5))
    with pytest.raises(JobNotFound):
        await _events(store, "nobody")
    with pytest.raises(ConfigError):
        follow_job(store, "job-1", 12)  # type: ignore[arg-type]


async def test_rows_written_by_someone_else_are_passed_over_and_never_stop_a_status_change(
    output_db: Db,
) -> None:
    store = await output_db.store()
    await _running(store)
    await store.publish_output("job-1", 1, "job-1/0/0", "good", b"1")
    insert = "INSERT INTO job_output (job_id, seq, kind, name, value, at) VALUES ($1, $2, $3, $4, $5, now())"
    if output_db.kind == "sqlite":
        insert = insert.replace("now()", "0")
        await output_db.raw(insert, "job-1", "x", "published", "text seq", "1")  # SQLite keeps a text seq
        await output_db.raw(insert, "job-1", 4, "published", "bad", b"\xff\xfe")  # not UTF-8
    await output_db.raw(insert, "job-1", 3, "weird", "other kind", "1")
    await output_db.raw(insert, "job-1", 5, "published", "not json", "{")
    await store.publish_output("job-1", 1, "job-1/0/1", "after", b"2")
    await store.set_status("job-1", 1, JobStatus.COMPLETED)
    events = await _events(store, "job-1")
    assert [(e.kind, e.name) for e in events] == [
        ("status", "RUNNING"),
        ("published", "good"),
        ("published", "after"),
        ("end", "COMPLETED"),
    ]
    assert events[2].cursor == cursor_for("job-1", 6)


async def test_a_hand_written_status_change_is_an_event_and_a_retried_job_goes_on(
    output_db: Db,
) -> None:
    store = await output_db.store()
    await _running(store)
    await output_db.raw(
        "UPDATE job SET status = 'DEAD_LETTER' WHERE id = $1", "job-1"
    )  # a control plane's UPDATE
    first = await _events(store, "job-1")
    assert [(e.kind, e.name) for e in first] == [("status", "RUNNING"), ("end", "DEAD_LETTER")]
    await store.retry("job-1")
    after_end = await _events(store, "job-1", first[-1].cursor)
    assert [(e.kind, e.name) for e in after_end] == [("status", "PENDING")]


async def test_a_job_that_ended_before_output_rows_existed_ends_its_follower(
    output_db: Db,
) -> None:
    store = await output_db.store()
    await _running(store)
    await store.set_status("job-1", 1, JobStatus.COMPLETED)
    await output_db.raw("DELETE FROM job_output WHERE job_id = $1", "job-1")
    [event] = await _events(store, "job-1")
    assert (event.kind, event.name, event.cursor) == ("end", "COMPLETED", cursor_for("job-1", 0))
    with anyio.fail_after(10):  # live: ends too, it does not wait for a row that will never come
        async with follow_job(store, "job-1") as events:
            assert [e.kind async for e in events] == ["end"]


async def test_a_live_follower_sees_what_comes_each_once_and_deltas_while_it_listens(
    output_db: Db,
) -> None:
    writer = await output_db.store()
    reader = await output_db.store()  # another process's store
    await _running(writer)
    seen: list[Any] = []
    with anyio.fail_after(30):
        async with follow_job(reader, "job-1") as events:
            first = await events.__anext__()
            assert (first.kind, first.name) == ("status", "RUNNING")
            await writer.publish_output("job-1", 1, "job-1/0/0", "p", b"1")
            seen.append(await events.__anext__())
            batch = orjson.dumps({"c": "job-1/0/1", "t": "hel", "d": 0, "r": False, "at": 1.5}).decode()
            await writer.send_deltas("job-1", [batch, batch.replace("hel", "lo")])
            while len([e for e in seen if e.kind == "delta"]) < 2:
                seen.append(await events.__anext__())
            await writer.set_status("job-1", 1, JobStatus.COMPLETED)
            seen.extend([event async for event in events])
    assert [(e.kind, e.name) for e in seen] == [
        ("published", "p"),
        ("delta", "text"),
        ("delta", "text"),
        ("end", "COMPLETED"),
    ]
    assert [e.value["text"] for e in seen if e.kind == "delta"] == ["hel", "lo"]
    assert seen[1].cursor == seen[0].cursor  # a delta leaves the follower where the last kept event did
    assert await writer.send_deltas("job-1", [batch]) is None  # an ended job gets none, and no error
    if output_db.kind == "sqlite":
        assert await output_db.raw("SELECT count(*) FROM job_output_delta") == [(2,)]
        # A minute on, the next job to end removes them: the ring table never grows with ended jobs.
        await output_db.raw("UPDATE job_output_delta SET at = at - 61")
        await _running(writer, "job-2")
        await writer.set_status("job-2", 1, JobStatus.FAILED)
        assert await output_db.raw("SELECT count(*) FROM job_output_delta") == [(0,)]


async def test_followers_share_one_listen_connection_and_leave_none_behind(postgres_url: str) -> None:
    db = Db("postgresql", postgres_url)
    try:
        await _share_and_leave(db)
    finally:
        for store in db.opened:
            await store.close()


async def _share_and_leave(db: Db) -> None:
    writer = await db.store()
    reader = await db.store()
    assert isinstance(reader, PostgresStore)
    await _running(writer)
    await _running(writer, "job-2")
    followers = [follow_job(reader, job) for job in ("job-1", "job-2") * 50]
    for follower in followers:
        assert (await follower.__anext__()).kind == "status"
    assert reader._followers.connections == 1
    for follower in followers:
        await follower.aclose()
    assert reader._followers.connections == 0
    # ... and a follower abandoned mid-wait (its task cancelled) releases its watch too.
    with anyio.move_on_after(0.3):
        async with follow_job(reader, "job-1") as events:
            async for _ in events:
                pass
    assert reader._followers.connections == 0


async def test_delta_batches_written_by_someone_else_are_passed_over(output_db: Db) -> None:
    writer = await output_db.store()
    await _running(writer)
    garbage = ["not json", "[]", '{"t": 5}', '{"c": 1, "t": "kept", "d": "x", "r": 1, "at": "now"}']
    with anyio.fail_after(30):
        async with follow_job(writer, "job-1") as events:
            assert (await events.__anext__()).kind == "status"
            await writer.send_deltas("job-1", garbage)
            delta = await events.__anext__()
            assert (delta.kind, delta.value) == (
                "delta",
                {"call": None, "text": "kept", "dropped": 0, "restart": False},
            )
            assert delta.time == 0.0


async def test_a_follower_whose_listen_connection_is_cut_still_sees_every_event(postgres_url: str) -> None:
    db = Db("postgresql", postgres_url)
    try:
        writer, reader = await db.store(), await db.store()
        await _running(writer)
        with anyio.fail_after(30):
            async with follow_job(reader, "job-1") as events:
                assert (await events.__anext__()).kind == "status"
                killed = await db.raw(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'"
                )
                assert killed == [(True,)]
                await writer.publish_output("job-1", 1, "job-1/0/0", "after the cut", b"1")
                assert (await events.__anext__()).name == "after the cut"  # read on the fallback wake
                await writer.publish_output("job-1", 1, "job-1/0/1", "woken again", b"2")
                assert (await events.__anext__()).name == "woken again"
                assert isinstance(reader, PostgresStore) and reader._followers.connections == 1  # back
    finally:
        for store in db.opened:
            await store.close()
