"""`CheckpointStore.release`: a process hands back the RUNNING job it holds, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from test_job_ops_contract import backend, make_store, store  # noqa: F401 - the contract's fixtures

from agentlife.stores import CheckpointStore, JobStatus

pytestmark = pytest.mark.anyio


async def _claimed(store: CheckpointStore, job_id: str) -> int:  # noqa: F811
    await store.create_job(job_id, "agent-a", {"n": job_id})
    row = await store.claim_next("agent-a")
    assert row is not None and row.id == job_id
    return row.attempt


async def test_a_released_job_is_runnable_again_at_once(store: CheckpointStore) -> None:  # noqa: F811
    attempt = await _claimed(store, "j")
    assert await store.release("j", attempt, JobStatus.PENDING)
    again = await store.claim_next("agent-a")
    assert again is not None and (again.id, again.attempt) == ("j", attempt + 1)


async def test_a_delayed_release_waits_for_its_not_before(store: CheckpointStore) -> None:  # noqa: F811
    attempt = await _claimed(store, "j")
    assert await store.release("j", attempt, JobStatus.RETRYING, delay_seconds=3600)
    row = await store.get_job("j")
    assert row is not None and row.status == JobStatus.RETRYING
    assert await store.claim_next("agent-a") is None
    assert await store.count_runnable() == {}


async def test_release_refuses_a_row_that_moved_on(store: CheckpointStore) -> None:  # noqa: F811
    attempt = await _claimed(store, "j")
    assert not await store.release("j", attempt - 1, JobStatus.PENDING)  # another attempt holds it
    await store.cancel("j", "stop")
    assert not await store.release("j", attempt + 1, JobStatus.PENDING)  # no longer RUNNING
    row = await store.get_job("j")
    assert row is not None and row.status == JobStatus.FAILED
    assert not await store.release("nope", 1, JobStatus.PENDING)


async def test_release_as_a_terminal_status(store: CheckpointStore) -> None:  # noqa: F811
    attempt = await _claimed(store, "j")
    assert await store.release("j", attempt, JobStatus.DEAD_LETTER)
    row = await store.get_job("j")
    assert row is not None and row.status == JobStatus.DEAD_LETTER
    with pytest.raises(ValueError, match="cannot release a job as RUNNING"):
        await store.release("j", attempt, JobStatus.RUNNING)
