"""The hot statements stay index reads as the job table grows: claim, due-time poll, pages, checkpoint write.

A table of 200 000 finished and 20 000 waiting rows (not yet due), analysed, is enough for the planner to
choose as it would at a million: a statement that reads the job table by a sequential scan, or whose plan
expects to read more than a page's rows, costs more with every job the fleet has ever run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agentlife.stores import PostgresStore, TableNames
from agentlife.stores._dialect import Sql
from agentlife.stores._pg_statements import pg_statements

pytestmark = pytest.mark.anyio

FINISHED, WAITING, HISTORY_JOBS = 200_000, 20_000, 10_000

#: A value for every parameter the statements below name, of the type the statement casts it to.
VALUES: dict[str, Any] = {
    "job_id": "done-000001",
    "attempt": 1,
    "owner": "host:1:claim",
    "agent_id": "agent-a",
    "status": "COMPLETED",
    "limit": 50,
    "cutoff": 0.0,
    "data": b"checkpoint",
    "crc": 0,
    "checkpoint_id": "cp-new",
    "step": 7,
    "input_tokens": 0,
    "output_tokens": 0,
    "cost_usd": 0.0,
    "key_limits": "{}",
    "key_default": 1,
    "agent_limit": 10,
}


def nodes(plan: dict[str, Any], limited: bool = False) -> Iterator[tuple[dict[str, Any], bool]]:
    """Each node of a plan, and whether a ``Limit`` above it stops its read early."""
    yield plan, limited
    for child in plan.get("Plans", ()):
        yield from nodes(child, limited or plan["Node Type"] == "Limit")


async def plan_of(conn: Any, sql: Sql) -> list[tuple[dict[str, Any], bool]]:
    text = await conn.fetchval("EXPLAIN (FORMAT JSON) " + sql.text, *sql.values(VALUES))
    return list(nodes(json.loads(text)[0]["Plan"]))


def unbounded_reads(plan: list[tuple[dict[str, Any], bool]]) -> list[tuple[str, str, int]]:
    """The reads of the job or history table that grow with the table: a sequential scan, or an index read
    neither stopped by a ``Limit`` nor expected to return at most a page of rows (one job's own rows)."""
    return [
        (node["Relation Name"], node["Node Type"], node["Plan Rows"])
        for node, limited in plan
        if node.get("Relation Name") in ("job", "checkpoint_history")
        and (node["Node Type"] == "Seq Scan" or (not limited and node["Plan Rows"] > 100))
    ]


async def fill(conn: Any) -> None:
    # The claiming agent (agent-a) has finished rows due in the past as well as parked waits: the planner,
    # taking status and not_before as independent, then expects many due rows of it, and a probe written as
    # EXISTS (... not_before <= now()) became a sequential scan of the whole table.
    await conn.execute(
        "INSERT INTO job (id, agent_id, status, payload, attempt, updated_at, not_before)"
        " SELECT 'done-' || lpad(i::text, 6, '0'), 'agent-' || chr(97 + i % 5), 'COMPLETED', NULL, 1,"
        " now() - i * interval '1 second', now() - i * interval '1 second'"
        f" FROM generate_series(1, {FINISHED}) AS i"
    )
    await conn.execute(
        "INSERT INTO job (id, agent_id, status, payload, attempt, updated_at, not_before, waiting)"
        " SELECT 'wait-' || lpad(i::text, 6, '0'), 'agent-a', 'WAITING', NULL, 1, now(),"
        " now() + interval '1 day' + i * interval '1 second', '{}'::jsonb"
        f" FROM generate_series(1, {WAITING}) AS i"
    )
    # A history of five checkpoints for each of the first jobs: the trim of the job written reads its own.
    await conn.execute(
        "INSERT INTO checkpoint_history (job_id, checkpoint_id, step, checkpoint, crc, created_at)"
        " SELECT 'done-' || lpad(i::text, 6, '0'), 'cp-' || s, s, 'x'::bytea, 0, now() - s * interval '1 s'"
        f" FROM generate_series(1, {HISTORY_JOBS}) AS i, generate_series(1, 5) AS s"
    )
    await conn.execute("ANALYZE job")
    await conn.execute("ANALYZE checkpoint_history")


async def test_hot_statements_read_the_job_table_by_index_past_a_large_history(postgres_url: str) -> None:
    import asyncpg

    store = PostgresStore(postgres_url)
    await store.open()
    await store.init_schema()
    await store.close()
    conn = await asyncpg.connect(postgres_url)
    try:
        await fill(conn)
        s = pg_statements(TableNames())
        statements: dict[str, Sql] = {
            "claim of an agent (and its next due time)": s.claim_agent,  # type: ignore[dict-item]
            "claim of any agent": s.claim_any,  # type: ignore[dict-item]
            "first page": s.page(False, False, None)[0],  # type: ignore[dict-item]
            "first page of a status": s.page(True, False, None)[0],  # type: ignore[dict-item]
            "first page of an agent": s.page(False, True, None)[0],  # type: ignore[dict-item]
            "checkpoint write": s.checkpoint((False, False, False, False, True)),  # type: ignore[dict-item]
        }
        # An idle claim (nothing of the agent due, its 20 000 waits parked) reads no waiting row: it used to
        # walk them all (20 000 rows removed by the index scan's filter, about 13 ms of server time).
        # The same for the claim under concurrency limits (a key's default limit, an agent's limit).
        for claim in (s.claim_agent, s.claim_limited(True, True, True)):
            assert isinstance(claim, Sql)
            text = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + claim.text, *claim.values(VALUES))
            filtered = [
                node.get("Rows Removed by Filter", 0) for node, _ in nodes(json.loads(text)[0]["Plan"])
            ]
            assert max(filtered) <= 100, (claim.text, filtered)
        bad = {}
        for name, sql in statements.items():
            assert isinstance(sql, Sql), name
            if found := unbounded_reads(await plan_of(conn, sql)):
                bad[name] = found
        assert not bad, bad
        # The overview's count of due rows reads every runnable row (it counts them), but only through the
        # partial index of runnable rows: it grows with the waiting rows, never with the finished ones.
        overview = await plan_of(conn, s.overview_runnable)  # type: ignore[arg-type]
        job_reads = [node for node, _ in overview if node.get("Relation Name") == "job"]
        assert all(node["Node Type"] != "Seq Scan" for node in job_reads), overview
        indexes = {node.get("Index Name") for node, _ in overview if "Index" in node["Node Type"]}
        assert indexes and indexes <= {"job_claim_idx", "job_agent_claim_idx", "job_agent_due_idx"}, overview
    finally:
        await conn.close()
