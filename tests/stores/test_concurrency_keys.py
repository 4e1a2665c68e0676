"""Concurrency keys, priority and running limits in the claim, on both stores (and racing on PostgreSQL)."""

from __future__ import annotations

import re
import time
import unicodedata
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_store_contract import Backend, StoreFactory

from agentlife import ConfigError
from agentlife.stores import CheckpointStore, JobStatus, PostgresStore, TableNames
from agentlife.stores._limits import (
    ClaimLimits,
    claim_limits_from_env,
    parse_priority,
    validate_concurrency_key,
)
from agentlife.stores._pg_statements import pg_statements

pytestmark = pytest.mark.anyio

KEY2 = ClaimLimits(key_default=2)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", str(tmp_path / "agentlife.db"), TableNames())
    return Backend("postgresql", request.getfixturevalue("postgres_url"), TableNames())


@pytest.fixture
async def make_store(backend: Backend) -> AsyncIterator[StoreFactory]:
    opened: list[CheckpointStore] = []

    async def make(**kwargs: Any) -> CheckpointStore:
        store = backend.open_store(**kwargs)
        await store.open()
        opened.append(store)
        await store.init_schema()
        return store

    yield make
    for store in reversed(opened):
        await store.close()


@pytest.fixture
async def store(make_store: StoreFactory) -> CheckpointStore:
    return await make_store()


async def _jobs(store: CheckpointStore, *specs: tuple[str, str | None, int], agent: str = "agent-a") -> None:
    for job_id, key, priority in specs:
        await store.create_job(job_id, agent, None, concurrency_key=key, priority=priority)


async def _claim_all(
    store: CheckpointStore, limits: ClaimLimits | None, agent: str | None = "agent-a"
) -> list[str]:
    claimed = []
    while (row := await store.claim_next(agent, limits=limits)) is not None:
        claimed.append(row.id)
    return claimed


async def _finish(store: CheckpointStore, job_id: str) -> None:
    row = await store.get_job(job_id)
    assert row is not None
    await store.set_status(job_id, row.attempt, JobStatus.COMPLETED, result={"ok": True})


# -- the row ---------------------------------------------------------------------------------------------


async def test_a_job_keeps_its_key_and_priority_and_an_existing_row_keeps_its_own(
    store: CheckpointStore,
) -> None:
    created = await store.create_job("j1", "agent-a", None, concurrency_key="tenant é/1", priority=-7)
    assert (created.concurrency_key, created.priority) == ("tenant é/1", -7)
    plain = await store.create_job("j2", "agent-a", None)
    assert (plain.concurrency_key, plain.priority) == (None, 0)
    again = await store.create_job("j1", "agent-a", None, concurrency_key="other", priority=5)
    assert (again.concurrency_key, again.priority) == ("tenant é/1", -7)
    claimed = await store.claim_next("agent-a")
    assert claimed is not None and (claimed.id, claimed.concurrency_key, claimed.priority) == ("j2", None, 0)
    claimed = await store.claim_next("agent-a")
    assert claimed is not None and (claimed.concurrency_key, claimed.priority) == ("tenant é/1", -7)
    assert [r.id for r in await store.list_jobs(concurrency_key="tenant é/1")] == ["j1"]
    assert await store.list_jobs(concurrency_key="nobody") == []


#: Keys and priorities a store refuses, each with what its one-line error says.
BAD_INPUT = [
    ("a\x00b", 0, "control character U+0000"),
    ("line\nbreak", 0, "control character U+000A"),
    ("x" * 10_000, 0, "10000 characters long"),
    ("", 0, "must not be empty"),
    ("  ", 0, "must not be empty"),
    ("\ud800", 0, "U+D800"),
    ("evil\u202egnp.exe", 0, "control character U+202E"),
    ("zero\u200bwidth", 0, "control character U+200B"),
    ("two\u2028lines", 0, "control character U+2028"),
    ("del\x7f", 0, "control character U+007F"),
    (b"bytes", 0, "must be a string"),
    (None, 1001, "out of range"),
    (None, -1001, "out of range"),
    (None, 2**63, "out of range"),
    (None, 1.5, "whole number"),
    (None, True, "whole number"),
    (None, "3", "whole number"),
]


async def test_a_bad_key_or_priority_is_one_line_and_writes_nothing(store: CheckpointStore) -> None:
    # One store per case would cost a database each: the cases share one, which must stay empty.
    for key, priority, needle in BAD_INPUT:
        with pytest.raises(ConfigError, match=re.escape(needle)) as caught:
            await store.create_job("j1", "agent-a", None, concurrency_key=key, priority=priority)
        assert "\n" not in str(caught.value), key
    assert await store.list_jobs() == []


# -- the order -------------------------------------------------------------------------------------------


async def test_higher_priority_first_then_creation_order_not_id_order(store: CheckpointStore) -> None:
    await _jobs(store, ("c-low", None, -1), ("z-first", "k", 0), ("b-second", None, 0), ("a-third", "k", 0))
    await _jobs(store, ("y-urgent", "k", 10))
    assert await _claim_all(store, None) == ["y-urgent", "z-first", "b-second", "a-third", "c-low"]


async def test_a_stream_of_another_keys_jobs_does_not_pass_a_keys_oldest_job(store: CheckpointStore) -> None:
    # Same priority: whatever the keys, the job created first is claimed first, so a busy key cannot
    # starve a quiet one; only the quiet key's own limit can hold its job back.
    await _jobs(store, ("quiet-1", "quiet", 0))
    order = []
    for i in range(5):
        await _jobs(store, (f"busy-{i}", "busy", 0))
        row = await store.claim_next("agent-a", limits=ClaimLimits(key_default=10))
        assert row is not None
        order.append(row.id)
    assert order[0] == "quiet-1"


# -- the limits ------------------------------------------------------------------------------------------


async def test_a_key_at_its_limit_is_skipped_and_other_jobs_are_claimed(store: CheckpointStore) -> None:
    await _jobs(store, *[(f"k-{i}", "k", 0) for i in range(4)], ("free-1", None, 0), ("other-1", "o", 0))
    assert await _claim_all(store, KEY2) == ["k-0", "k-1", "free-1", "other-1"]
    assert await store.claim_next("agent-a", limits=KEY2) is None
    await _finish(store, "k-0")
    assert await _claim_all(store, KEY2) == ["k-2"]  # creation order within the key


async def test_per_key_overrides_beat_the_default_and_no_default_means_unlimited(
    store: CheckpointStore,
) -> None:
    await _jobs(
        store, *[(f"big-{i}", "big", 0) for i in range(4)], *[(f"small-{i}", "small", 0) for i in range(3)]
    )
    only = ClaimLimits(key_limits={"small": 1})  # "big" has no limit at all
    assert sorted(await _claim_all(store, only)) == ["big-0", "big-1", "big-2", "big-3", "small-0"]
    await _jobs(store, ("big-4", "big", 0), ("small-9", "small", 0))
    both = ClaimLimits(key_default=1, key_limits={"big": 6})
    assert await _claim_all(store, both) == ["big-4"]


async def test_the_agent_limit_counts_every_running_job_of_the_agent(store: CheckpointStore) -> None:
    await _jobs(store, ("a-1", None, 0), ("a-2", "k", 0), ("a-3", None, 0))
    await _jobs(store, ("b-1", None, 0), agent="agent-b")
    await store.claim("a-3", 1)  # RUNNING by a job-per-pod run: counts all the same
    limits = ClaimLimits(agent=2)
    assert await _claim_all(store, limits) == ["a-1"]
    assert await _claim_all(store, limits, agent="agent-b") == ["b-1"]  # another agent is not held back
    await _finish(store, "a-3")
    assert await _claim_all(store, limits) == ["a-2"]


async def test_a_limit_lowered_below_the_running_jobs_claims_nothing_until_they_end(
    store: CheckpointStore,
) -> None:
    await _jobs(store, *[(f"k-{i}", "k", 0) for i in range(5)])
    assert await _claim_all(store, ClaimLimits(key_default=3)) == ["k-0", "k-1", "k-2"]
    lowered = ClaimLimits(key_default=2)
    assert await store.claim_next("agent-a", limits=lowered) is None
    await _finish(store, "k-0")  # 2 running: still at the new limit
    assert await store.claim_next("agent-a", limits=lowered) is None
    await _finish(store, "k-1")  # 1 running, holding slot 3 of the old limit: slot 1 is free
    assert await _claim_all(store, lowered) == ["k-3"]
    await _finish(store, "k-2")
    assert await _claim_all(store, lowered) == ["k-4"]


async def test_without_limits_the_claim_ignores_keys(store: CheckpointStore) -> None:
    await _jobs(store, *[(f"k-{i}", "k", 0) for i in range(3)])
    assert await _claim_all(store, ClaimLimits()) == ["k-0", "k-1", "k-2"]


async def test_a_dead_workers_running_row_holds_its_keys_slot_until_the_reaper_takes_it(
    make_store: StoreFactory,
) -> None:
    dead, alive = await make_store(), await make_store()
    await _jobs(dead, ("k-1", "k", 0), ("k-2", "k", 0))
    limits = ClaimLimits(key_default=1)
    assert (await dead.claim_next("agent-a", limits=limits)).id == "k-1"  # type: ignore[union-attr]
    # Its process is gone (no heartbeat): the slot stays taken, the limit holds.
    assert await alive.claim_next("agent-a", limits=limits) is None
    decisions = await alive.reap(60, now=time.time() + 3600)
    assert [d.job_id for d in decisions] == ["k-1"]
    assert (await alive.get_job("k-1")).status == JobStatus.RETRYING  # type: ignore[union-attr]
    assert (await alive.claim_next("agent-a", limits=limits)).id == "k-2"  # type: ignore[union-attr]


async def test_a_row_back_to_running_after_an_approval_does_not_collide_with_a_slot_taken_meanwhile(
    store: CheckpointStore,
) -> None:
    # A job parked for approval frees its key's slot; another job takes it; the approved job comes back to
    # RUNNING in its live process. Its old slot must not make that write fail.
    await _jobs(store, ("k-1", "k", 0), ("k-2", "k", 0))
    limits = ClaimLimits(key_default=1, agent=1)
    first = await store.claim_next("agent-a", limits=limits)
    assert first is not None
    await store.set_status("k-1", first.attempt, JobStatus.WAITING_FOR_APPROVAL)
    second = await store.claim_next("agent-a", limits=limits)
    assert second is not None and second.id == "k-2"
    await store.set_status("k-1", first.attempt, JobStatus.RUNNING, expect=(JobStatus.WAITING_FOR_APPROVAL,))
    await _finish(store, "k-2")
    await _finish(store, "k-1")


async def test_rows_written_by_someone_else_count_and_read(store: CheckpointStore, backend: Backend) -> None:
    t = backend.tables.job
    now = "1.0" if backend.kind == "sqlite" else "now()"
    # A RUNNING row of the key with no slot (an older version, or another tool): it counts.
    await backend.raw(
        f"INSERT INTO {t} (id, agent_id, status, attempt, updated_at, concurrency_key, priority)"
        f" VALUES ('hand-run', 'agent-a', 'RUNNING', 1, {now}, 'k', 0)"
    )
    await backend.raw(
        f"INSERT INTO {t} (id, agent_id, status, attempt, updated_at, concurrency_key, priority)"
        f" VALUES ('hand-top', 'agent-a', 'PENDING', 0, {now}, 'k', 2147483647)"
    )
    await _jobs(store, ("k-1", "k", 0), ("free", None, 1000))
    limits = ClaimLimits(key_default=2)
    assert await _claim_all(store, limits) == ["hand-top", "free"]
    if backend.kind == "sqlite":  # SQLite keeps whatever was written: a priority that is text reads as 0
        await backend.raw(f"UPDATE {t} SET priority = 'high', concurrency_key = x'ff00' WHERE id = 'k-1'")
        row = await store.get_job("k-1")
        assert row is not None and (row.priority, row.concurrency_key) == (0, "\ufffd\x00")


# -- the configuration -----------------------------------------------------------------------------------


def test_limits_from_the_environment() -> None:
    env = {
        "AGENTLIFE_CONCURRENCY_KEY_LIMIT": " 2 ",
        "AGENTLIFE_CONCURRENCY_KEY_LIMITS": '{"tenant-a": 5, "t\u00e9": 1}',
        "AGENTLIFE_AGENT_RUNNING_LIMIT": "40",
    }
    limits = claim_limits_from_env(env)
    assert (limits.key_default, dict(limits.key_limits), limits.agent) == (
        2,
        {"tenant-a": 5, "t\u00e9": 1},
        40,
    )
    assert not claim_limits_from_env({}).active


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("AGENTLIFE_CONCURRENCY_KEY_LIMIT", "0", "out of range"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMIT", "-1", "out of range"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMIT", "nan", "not a whole number"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMIT", "2.5", "not a whole number"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMIT", "1e300", "not a whole number"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMIT", "9" * 400, "not a whole number"),
        ("AGENTLIFE_AGENT_RUNNING_LIMIT", "100001", "out of range"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMITS", "tenant-a=2", "not JSON"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMITS", "[2]", "JSON object"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMITS", '{"a": 0}', "out of range"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMITS", '{"a": "2"}', "whole number"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMITS", '{"a": 2.0}', "whole number"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMITS", '{"a": true}', "whole number"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMITS", '{"a\\u0000": 1}', "control character"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMITS", '{"": 1}', "must not be empty"),
        # Set but blank: a template that rendered nothing must not lift the limit from the fleet.
        ("AGENTLIFE_CONCURRENCY_KEY_LIMIT", "", "set but blank"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMIT", "   ", "set but blank"),
        ("AGENTLIFE_AGENT_RUNNING_LIMIT", "", "set but blank"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMITS", " ", "set but blank"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMITS", '{"a": 1, "a": 2}', "names key 'a' twice"),
        ("AGENTLIFE_CONCURRENCY_KEY_LIMITS", '{"a": NaN}', "whole number"),
    ],
)
def test_bad_limits_are_one_line_errors_at_boot(name: str, value: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as caught:
        claim_limits_from_env({name: value})
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 300


def test_priority_and_key_from_the_command_line() -> None:
    assert parse_priority(" -5 ") == -5
    assert parse_priority("+1000") == 1000
    for bad in ("1001", "1e3", "", "nan", "9" * 5000, "0x10", "+-5", "\u00b2", "\u0661"):
        with pytest.raises(ConfigError):
            parse_priority(bad)
    assert validate_concurrency_key("tenant/é 1") == "tenant/é 1"
    assert validate_concurrency_key(None) is None


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=250), st.binary(max_size=20), st.integers(), st.none()))
def test_any_key_is_taken_whole_or_refused_in_one_line(key: Any) -> None:
    taken, refusal = _outcome(validate_concurrency_key, key)
    if refusal is not None:
        assert "\n" not in refusal and len(refusal) < 200
        return
    assert taken == key
    if key is not None:
        assert 1 <= len(key) <= 200 and key.strip()
        assert all(unicodedata.category(c) not in {"Cc", "Cf", "Cs", "Zl", "Zp"} for c in key)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_any_priority_text_is_a_number_in_range_or_one_line(text: str) -> None:
    priority, refusal = _outcome(parse_priority, text)
    if refusal is not None:
        assert "\n" not in refusal
        return
    assert -1000 <= priority <= 1000 and priority == int(text.strip())


def _outcome(check: Any, value: Any) -> tuple[Any, str | None]:
    """What ``check(value)`` returned, or the text of the `ConfigError` it raised (anything else fails)."""
    try:
        return check(value), None
    except ConfigError as exc:
        return None, str(exc)


# -- racing claimers (PostgreSQL) ------------------------------------------------------------------------


async def test_many_connections_racing_never_exceed_a_keys_or_the_agents_limit(postgres_url: str) -> None:
    """30 stores (each its own connection) claim at once, wave after wave until a wave claims nothing; then
    every running row is finished and the next round begins. No wave may leave a key above its limit, and
    each round ends with exactly the limit of each key running, the key's oldest jobs."""
    import asyncpg

    first = PostgresStore(postgres_url, max_size=2)
    await first.open()
    await first.init_schema()
    conn = await asyncpg.connect(postgres_url)
    stores = [first] + [PostgresStore(postgres_url, max_size=1) for _ in range(29)]

    async def round_of(limits: ClaimLimits, check: Any) -> list[str]:
        # A claim that found a key's first row locked by a concurrent one skips the key (its order), so one
        # wave may leave a key below its limit: the next wave fills it.
        got: list[str] = []
        while True:
            before = len(got)
            async with anyio.create_task_group() as tg:
                for s in stores:
                    tg.start_soon(claim_and_keep, s, limits, got)
            check(await first.list_jobs(status="RUNNING", limit=1000))
            if len(got) == before:
                return got

    try:
        for s in stores[1:]:
            await s.open()
        keys = ("red", "green", "blue")
        for i in range(20):
            for key in keys:
                await first.create_job(f"{key}-{i:02d}", "agent-a", None, concurrency_key=key)

        def at_most_two_per_key(running: list[Any]) -> None:
            per_key = Counter(r.concurrency_key for r in running)
            assert max(per_key.values()) <= 2, per_key

        for n in range(4):
            got = await round_of(ClaimLimits(key_default=2), at_most_two_per_key)
            # Exactly the limit of each key, its oldest jobs: round n ran each key's jobs 2n and 2n+1.
            expected = sorted(f"{key}-{i:02d}" for key in keys for i in (2 * n, 2 * n + 1))
            assert sorted(got) == expected
            await conn.execute("UPDATE job SET status = 'COMPLETED' WHERE status = 'RUNNING'")

        def at_most_three(running: list[Any]) -> None:
            assert len(running) <= 3, [r.id for r in running]

        for _ in range(4):  # the agent's limit, racing the same way (no key order serialises these claims)
            got = await round_of(ClaimLimits(agent=3), at_most_three)
            assert len(got) == 3
            await conn.execute("UPDATE job SET status = 'COMPLETED' WHERE status = 'RUNNING'")
    finally:
        await conn.close()
        for s in stores:
            await s.close()


async def claim_and_keep(store: CheckpointStore, limits: ClaimLimits, got: list[str]) -> None:
    row = await store.claim_next("agent-a", limits=limits)
    if row is not None:
        got.append(row.id)


async def test_a_slot_freed_wakes_the_agents_idle_workers_on_postgres(postgres_url: str) -> None:
    # A worker whose claim found the key full waits for work: the end of a job that held a slot wakes it,
    # as the insert of a new job does, instead of leaving it to its fallback poll.
    store = PostgresStore(postgres_url)
    await store.open()
    await store.init_schema()
    try:
        await _jobs(store, ("k-1", "k", 0), ("k-2", "k", 0))
        limits = ClaimLimits(key_default=1)
        first = await store.claim_next("agent-a", limits=limits)
        assert first is not None and await store.claim_next("agent-a", limits=limits) is None
        assert await store.wait_for_work("agent-a", 30) is True  # the first wait opens the LISTEN
        woken: list[bool] = []

        async def wait() -> None:
            woken.append(await store.wait_for_work("agent-a", 30))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.05)
            await store.set_status("k-1", first.attempt, JobStatus.COMPLETED)
        assert woken == [True]  # 30 s is the timeout: True can only be the notification
        assert (await store.claim_next("agent-a", limits=limits)).id == "k-2"  # type: ignore[union-attr]
    finally:
        await store.close()


async def test_the_limited_claim_stays_an_index_scan_past_many_rows_of_a_key_at_its_limit(
    postgres_url: str,
) -> None:
    import asyncpg

    store = PostgresStore(postgres_url)
    await store.open()
    await store.init_schema()
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(
            "INSERT INTO job (id, agent_id, status, payload, updated_at, not_before, concurrency_key)"
            " SELECT 'full-' || lpad(i::text, 5, '0'), 'agent-a', 'PENDING', NULL, now(),"
            " now() - interval '1 hour', 'full' FROM generate_series(1, 5000) AS i"
        )
        await conn.execute(
            "INSERT INTO job (id, agent_id, status, payload, updated_at, not_before)"
            " SELECT 'done-' || i, 'agent-a', 'COMPLETED', NULL, now(), now()"
            " FROM generate_series(1, 5000) AS i"
        )
        await store.create_job("fresh", "agent-a", None, concurrency_key="other")
        limits = ClaimLimits(key_default=1)
        assert (await store.claim_next("agent-a", limits=limits)).id == "full-00001"  # type: ignore[union-attr]
        await conn.execute("ANALYZE job")
        sql = pg_statements(TableNames()).claim_limited(True, True, False)
        values = sql.values({"key_limits": "{}", "key_default": 1, "owner": "x", "agent_id": "agent-a"})
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN (COSTS OFF) " + sql.text, *values))
        claimed = await store.claim_next("agent-a", limits=limits)
        assert claimed is not None and claimed.id == "fresh"  # past 4 999 rows of the full key
        assert "Seq Scan on job c" not in plan, plan
        # An index in the claim's order, read from its start: no sort of the runnable rows, no table scan.
        assert re.search(r"Index Scan using job_(agent_)?claim_idx on job c\n", plan), plan
    finally:
        await conn.close()
        await store.close()
