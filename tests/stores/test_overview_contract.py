"""`OperatorStore.job_overview` on SQLite and a real PostgreSQL: its counts are the rows ``list_jobs``
returns, per status and agent; the runnable queue, the stale RUNNING rows and the recent ends; and an
approval request's arguments and model text kept with it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_store_contract import Backend, StoreFactory

from agentlife.stores import ApprovalRequest, CheckpointStore, JobStatus, TableNames
from agentlife.stores._overview import MAX_STALE

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", str(tmp_path / "agentlife.db"), TableNames())
    return Backend("postgresql", request.getfixturevalue("postgres_url"), TableNames())


@pytest.fixture
async def make_store(backend: Backend) -> AsyncIterator[StoreFactory]:
    opened: list[CheckpointStore] = []

    async def make() -> CheckpointStore:
        store = backend.open_store()
        await store.open()
        opened.append(store)
        await store.init_schema()
        return store

    yield make
    for store in reversed(opened):
        await store.close()


async def test_the_overview_counts_what_list_jobs_returns(make_store: StoreFactory) -> None:
    store = await make_store()
    for i in range(5):
        await store.create_job(f"p-{i}", "alpha" if i % 2 else "beta", {})
    for job_id in ("r-1", "r-2"):
        await store.create_job(job_id, "alpha", {})
        await store.claim(job_id, 1)
    await store.create_job("c-1", "beta", {})
    await store.claim("c-1", 1)
    await store.set_status("c-1", 1, JobStatus.COMPLETED, result={})
    await store.create_job("f-1", "beta", {})
    await store.cancel("f-1", "stop")
    await store.create_job("park-1", "alpha", {})
    await store.claim("park-1", 1)
    arguments = {"target": "prod", "n": 3}
    await store.request_approval(
        "park-1", 1, ApprovalRequest("park-1/0/1", "d", "deploy", 0, 1, arguments=arguments, said="why")
    )

    found = await store.job_overview(3600.0)
    for (status, agent), count in found.counts.items():
        assert len(await store.list_jobs(status, agent, 1000)) == count, (status, agent)
    assert sum(found.counts.values()) == len(await store.list_jobs(None, None, 1000)) == 10
    assert found.counts[("PENDING", "beta")] == 3 and found.counts[("RUNNING", "alpha")] == 2
    assert found.runnable == 5 and found.oldest_runnable is not None
    assert found.oldest_runnable <= found.at
    assert found.stale == 0 and found.stale_rows == []
    assert found.ended == {"COMPLETED": 1, "FAILED": 1} and not found.more_groups
    # A heartbeat older than the limit (here: any, with a limit below zero) makes a RUNNING row stale.
    stale = await store.job_overview(-60.0)
    assert stale.stale == 2 and sorted(job for job, _ in stale.stale_rows) == ["r-1", "r-2"]
    assert all(beat is not None and beat <= stale.at for _, beat in stale.stale_rows)
    assert (await store.job_overview(3600.0, window=-60.0)).ended == {}
    approval = await store.get_approval("park-1")
    assert approval is not None and approval.request is not None
    assert approval.request["arguments"] == arguments and approval.request["said"] == "why"


async def test_the_overview_names_at_most_the_stalest_rows(make_store: StoreFactory) -> None:
    store = await make_store()
    for i in range(MAX_STALE + 3):
        await store.create_job(f"r-{i:02d}", "alpha", {})
        await store.claim(f"r-{i:02d}", 1)
    found = await store.job_overview(-60.0)
    assert found.stale == MAX_STALE + 3 and len(found.stale_rows) == MAX_STALE
