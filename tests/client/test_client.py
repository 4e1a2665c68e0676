"""`agentlife.Client` in-process, on SQLite and a real PostgreSQL: the job's side is played by a second
store (claim, finish, crash, park) exactly as a worker writes it.

Read top to bottom: a start and its result; a start retried; a result that waits past a crash; the typed
errors of a job that ends without a result; reading and paging; input that is almost right (nothing
written); operators racing; secrets in what the client says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_store_contract import Backend

from agentlife import (
    BlockingClient,
    Client,
    ConfigError,
    JobCancelled,
    JobDeadLettered,
    JobFailed,
    JobNotFound,
    JobStateConflict,
    ResultTimeout,
    StoreError,
    StoreUnavailable,
)
from agentlife._jobs._actor import default_actor
from agentlife.stores import ApprovalRequest, CheckpointStore, JobStatus, TableNames

pytestmark = pytest.mark.anyio

AGENT = "app-agent"


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", str(tmp_path / "agentlife.db"), TableNames())
    return Backend("postgresql", request.getfixturevalue("postgres_url"), TableNames())


@pytest.fixture
def url(backend: Backend) -> str:
    return f"sqlite:///{backend.location}" if backend.kind == "sqlite" else backend.location


@pytest.fixture
async def worker(backend: Backend) -> AsyncIterator[CheckpointStore]:
    """The store a worker would hold: it makes the schema (as ``db init``) and plays the job's process."""
    store = backend.open_store()
    await store.open()
    await store.init_schema()
    yield store
    await store.close()


@pytest.fixture
async def client(url: str, worker: CheckpointStore) -> AsyncIterator[Client]:
    async with await Client.connect(url) as client:
        yield client


@contextlib.asynccontextmanager
async def opened(backend: Backend, url: str) -> AsyncIterator[tuple[CheckpointStore, Client]]:
    """A worker's store on ``backend`` (its schema made, as ``db init``) and a client of ``url``."""
    worker = backend.open_store()
    await worker.open()
    try:
        await worker.init_schema()
        async with await Client.connect(url) as client:
            yield worker, client
    finally:
        await worker.close()


async def finish(worker: CheckpointStore, job_id: str, attempt: int, status: str, **kwargs: Any) -> None:
    await worker.claim(job_id, attempt)
    await worker.set_status(job_id, attempt, status, **kwargs)


async def result_while(client: Client, job_id: str, meanwhile: Awaitable[None]) -> Any:
    """``client.result(job_id)``, with ``meanwhile`` run once the wait is under way."""
    got: list[Any] = []

    async def wait() -> None:
        got.append(await client.result(job_id, timeout=120))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        await meanwhile
    return got[0]


async def count_rows(backend: Backend) -> int:
    return int((await backend.raw("SELECT count(*) FROM job"))[0][0])


# -- a start and its result -------------------------------------------------------------------------------


async def test_a_started_job_s_result_is_what_its_step_returned(
    client: Client, worker: CheckpointStore
) -> None:
    handle = await client.start(AGENT, {"topic": "tides"}, job_id="research-1")
    assert (handle.job_id, handle.agent_id) == ("research-1", AGENT)
    ended = finish(worker, "research-1", 1, JobStatus.COMPLETED, result={"answer": 42})
    assert await result_while(client, "research-1", ended) == {"answer": 42}
    assert await client.result("research-1", timeout=1) == {"answer": 42}  # an ended job answers at once


async def test_a_start_without_a_job_id_makes_a_new_job_each_time(client: Client, backend: Backend) -> None:
    first, second = await client.start(AGENT), await client.start(AGENT)
    assert first.job_id != second.job_id and first.job_id.startswith("job-")
    assert await count_rows(backend) == 2


# -- a start retried -------------------------------------------------------------------------------------


async def test_starting_the_same_job_again_returns_it_and_another_payload_conflicts(
    client: Client, worker: CheckpointStore, backend: Backend
) -> None:
    payload = {"b": [1, 2.5, True, None], "a": {"x": "y"}, "big": 1e300, "n": 10**18}
    await client.start(AGENT, payload, job_id="same")
    await finish(worker, "same", 1, JobStatus.COMPLETED, result="done")
    again = await client.start(AGENT, dict(reversed(payload.items())), job_id="same")
    assert again.job_id == "same"
    assert (await client.get("same")).status == JobStatus.COMPLETED  # the existing job, not a new one
    with pytest.raises(JobStateConflict, match="another payload") as caught:
        await client.start(AGENT, {**payload, "b": [1, 2.5, 1, None]}, job_id="same")  # True is not 1
    assert "tides" not in str(caught.value)
    with pytest.raises(JobStateConflict, match="another agent"):
        await client.start("other-agent", payload, job_id="same")
    assert await count_rows(backend) == 1


async def test_a_start_cut_short_by_a_timeout_and_retried_creates_one_job(
    url: str, client: Client, backend: Backend
) -> None:
    async with await Client.connect(url) as other:
        results: list[str] = []

        async def start(c: Client) -> None:
            results.append((await c.start(AGENT, {"n": 1}, job_id="retried")).job_id)

        with anyio.move_on_after(0):  # the caller's own timeout, before or after the insert
            await client.start(AGENT, {"n": 1}, job_id="retried")
        async with anyio.create_task_group() as tg:  # the retries, from two processes' clients at once
            tg.start_soon(start, client)
            tg.start_soon(start, other)
    assert results == ["retried", "retried"]
    assert await count_rows(backend) == 1


# -- a result that waits past a crash ------------------------------------------------------------------


async def test_result_of_a_job_retried_after_a_crash_is_its_final_outcome(
    client: Client, worker: CheckpointStore
) -> None:
    await client.start(AGENT, None, job_id="crashy")
    crash = {"at": 1.0, "attempt": 1, "exit_code": 137, "error_class": "Killed", "message": "SIGKILL"}
    await finish(worker, "crashy", 1, JobStatus.RETRYING, error=crash)
    with pytest.raises(ResultTimeout) as timed_out:  # a crash is not an end: the wait goes on
        await client.result("crashy", timeout=0.2)
    assert isinstance(timed_out.value, TimeoutError) and timed_out.value.status == JobStatus.RETRYING
    ended = finish(worker, "crashy", 2, JobStatus.COMPLETED, result="second try")
    assert await result_while(client, "crashy", ended) == "second try"


# -- jobs that end without a result ---------------------------------------------------------------------


async def test_a_failed_job_raises_job_failed_with_its_last_crash_record(
    client: Client, worker: CheckpointStore
) -> None:
    await client.start(AGENT, None, job_id="failing")
    record = {"at": 2.0, "attempt": 1, "exit_code": 1, "error_class": "ValueError", "message": "bad\ninput"}
    await finish(worker, "failing", 1, JobStatus.FAILED, error=record)
    with pytest.raises(JobFailed) as caught:
        await client.result("failing")
    error = caught.value
    assert type(error) is JobFailed
    assert (error.job_id, error.status, error.attempt) == ("failing", "FAILED", 1)
    assert error.last_error == record
    assert str(error) == "job failing ended FAILED on attempt 1: ValueError: bad input"


async def test_a_dead_lettered_job_raises_job_dead_lettered(client: Client, worker: CheckpointStore) -> None:
    await client.start(AGENT, None, job_id="poison")
    await finish(worker, "poison", 1, JobStatus.DEAD_LETTER, error={"exit_code": 1, "error_class": "Boom"})
    with pytest.raises(JobDeadLettered) as caught:
        await client.result("poison")
    assert isinstance(caught.value, JobFailed) and caught.value.status == "DEAD_LETTER"


async def test_a_cancelled_job_raises_job_cancelled_and_a_retry_waits_again(
    client: Client, worker: CheckpointStore
) -> None:
    await client.start(AGENT, None, job_id="stopped")
    summary = await client.cancel("stopped", "user clicked stop")
    assert (summary.status, summary.attempt, summary.finished) == ("FAILED", 1, True)
    with pytest.raises(JobCancelled, match="Cancelled: user clicked stop") as caught:
        await client.result("stopped")
    assert caught.value.last_error is not None and caught.value.last_error["error_class"] == "Cancelled"
    assert (await client.retry("stopped")).status == JobStatus.PENDING
    with pytest.raises(ResultTimeout):
        await client.result("stopped", timeout=0.05)


async def test_a_result_no_one_can_read_is_a_store_error_not_a_none(tmp_path: Path) -> None:
    backend = Backend("sqlite", str(tmp_path / "torn.db"), TableNames())  # jsonb cannot hold such bytes
    async with opened(backend, f"sqlite:///{backend.location}") as (worker, client):
        await client.start(AGENT, None, job_id="torn")
        await finish(worker, "torn", 1, JobStatus.COMPLETED, result={"ok": True})
        # What a disk that tore, or another client, left in the column.
        await backend.raw("UPDATE job SET result = X'00FF' WHERE id = 'torn'")
        with pytest.raises(StoreError, match="result cannot be read") as caught:
            await client.result("torn")
        assert "\n" not in str(caught.value)


# -- reading and paging ------------------------------------------------------------------------------------


async def test_get_shows_what_a_parked_job_waits_for_in_a_frozen_snapshot(
    client: Client, worker: CheckpointStore
) -> None:
    await client.start(AGENT, {"q": 1}, job_id="parked")
    await worker.claim("parked", 1)
    await worker.add_usage("parked", 1, 120, 30, 0.01)
    request = ApprovalRequest("parked/0/0", "d1g3st", "deploy", "{}", 1.0)
    await worker.request_approval("parked", 1, request)
    await client.send("parked", "note", {"k": "v"})
    job = await client.get("parked")
    assert (job.status, job.attempt, job.payload, job.result) == ("WAITING_FOR_APPROVAL", 1, {"q": 1}, None)
    assert job.approval_request is not None and job.approval_request["invocation_id"] == "parked/0/0"
    assert job.tokens_used["input"] == 120 and dict(job.events_kept) == {"note": 1}
    assert any("deploy (parked/0/0, digest d1g3st)" in line for line in job.waits_for)
    assert not job.finished and job.errors == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.status = "COMPLETED"  # type: ignore[misc]
    with pytest.raises(TypeError):
        job.tokens_used["input"] = 0  # type: ignore[index]
    with pytest.raises(JobNotFound, match="job nope does not exist"):
        await client.get("nope")


async def test_list_pages_through_every_job_once_with_the_job_list_filters(
    client: Client, worker: CheckpointStore
) -> None:
    for n in range(5):
        await client.start(AGENT if n % 2 else "other-agent", {"n": n}, job_id=f"listed-{n}")
    await finish(worker, "listed-3", 1, JobStatus.COMPLETED, result=None)
    seen: list[str] = []
    page = await client.list(limit=2)
    while True:
        seen += [job.job_id for job in page.jobs]
        if page.next_cursor is None:
            break
        page = await client.list(limit=2, after=page.next_cursor)
    assert sorted(seen) == [f"listed-{n}" for n in range(5)] and len(seen) == 5
    assert [j.job_id for j in (await client.list(agent_id=AGENT)).jobs] == ["listed-3", "listed-1"]
    done = (await client.list(status="COMPLETED")).jobs
    assert [(j.job_id, j.status, j.attempt, j.finished) for j in done] == [("listed-3", "COMPLETED", 1, True)]


# -- input that is almost right: one line, nothing written --------------------------------------------------

NOT_JSON = [
    {1, 2},
    {"when": object()},
    {"x": math.nan},
    {"x": math.inf},
    {"k": "\x00"},
    {"\x00": 1},
    {"s": "\ud800"},
    {1: "int key"},
    (1, 2),
    b"bytes",
    2**64,
    "x" * (1024 * 1024 + 1),
]


async def test_a_payload_the_row_cannot_hold_is_refused_in_one_line_and_nothing_is_written(
    client: Client, backend: Backend
) -> None:
    for payload in NOT_JSON:  # one store per test, not per case: each case is the same two checks
        with pytest.raises(ConfigError) as caught:
            await client.start(AGENT, payload, job_id="refused")
        assert "\n" not in str(caught.value) and "the payload" in str(caught.value), payload
    assert await count_rows(backend) == 0


BAD_IDS = ["", "../etc", "a/b", ".", "-lead", "x" * 129, "tab\there", "nul\x00", "é", 7, None]


async def test_ids_that_are_almost_right_are_refused_before_the_store_is_touched(
    client: Client, backend: Backend
) -> None:
    for bad in BAD_IDS:
        for call in (
            lambda b: client.start(b, None),
            lambda b: client.start(AGENT, None, job_id=b),
        ):
            if bad is None:
                continue  # a None job id makes a new one
            with pytest.raises(ConfigError) as caught:
                await call(bad)
            assert "\n" not in str(caught.value)
        for operation in (
            client.get,
            client.result,
            client.retry,
            client.cancel,
            client.approve,
            client.reject,
        ):
            with pytest.raises(ConfigError):
                await operation(bad)
        with pytest.raises(ConfigError):
            await client.send(bad, "name")
    assert await count_rows(backend) == 0


async def test_timeouts_and_filters_that_are_no_numbers_are_refused(client: Client) -> None:
    await client.start(AGENT, None, job_id="waited")
    for timeout in (0, 0.0, -0.0, -1, math.nan, "5", True, [1]):
        with pytest.raises(ConfigError, match="timeout") as caught:
            await client.result("waited", timeout=timeout)  # type: ignore[arg-type]
        assert "\n" not in str(caught.value)
    for limit in (0, -1, 2**63, True, 1.5, 1001):
        with pytest.raises(ConfigError, match="limit"):
            await client.list(limit=limit)
    with pytest.raises(ConfigError, match="status"):
        await client.list(status="DONE")
    for cursor in ("forged", "", "W10", "x" * 70_000, "WyJuIiwibmFuIiwicyIsImEiXQ"):
        with pytest.raises(ConfigError, match="after"):
            await client.list(after=cursor)
    with pytest.raises(ConfigError, match="agent_id"):
        await client.list(agent_id="a\x00b")


async def test_events_and_reasons_that_are_almost_right_are_refused_and_nothing_is_sent(
    client: Client, backend: Backend
) -> None:
    await client.start(AGENT, None, job_id="answered")
    for name in ("", " ", "a\nb", "bell\x07", "x" * 1000, 5):
        with pytest.raises(ConfigError):
            await client.send("answered", name)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        await client.send("answered", "ok", {"v": math.nan})
    for reason in ("two\nlines", "x" * 501, "nul\x00", 3):
        with pytest.raises(ConfigError, match="reason"):
            await client.cancel("answered", reason)  # type: ignore[arg-type]
    assert (await client.get("answered")).status == JobStatus.PENDING
    assert await backend.raw("SELECT count(*) FROM job_event") == [(0,)]


async def test_a_url_that_names_no_store_is_one_line_without_its_password(tmp_path: Path) -> None:
    for url in ("sqlite://", "sqlite:///:memory:", "mysql://u:hunter2@h/db", "postgresql://u:pa/ss@h/db"):
        with pytest.raises(ConfigError) as caught:
            await Client.connect(url)
        assert "hunter2" not in str(caught.value) and "pa/ss" not in str(caught.value)
    with pytest.raises(StoreError, match="no store at"):
        await Client.connect(f"sqlite:///{tmp_path / 'missing.db'}")
    assert not (tmp_path / "missing.db").exists()


# -- operators racing ---------------------------------------------------------------------------------------


async def test_an_approve_racing_a_cancel_never_runs_the_cancelled_call(
    url: str, client: Client, worker: CheckpointStore
) -> None:
    for n in range(6):
        job = f"raced-{n}"
        await client.start(AGENT, None, job_id=job)
        await worker.claim(job, 1)
        await worker.request_approval(job, 1, ApprovalRequest(f"{job}/0/0", "d", "pay", "{}", 1.0))
        outcomes: dict[str, str] = {}
        async with await Client.connect(url) as other:

            async def act(name: str, operation: Any, outcomes: dict[str, str] = outcomes) -> None:
                try:
                    await operation
                    outcomes[name] = "won"
                except JobStateConflict:
                    outcomes[name] = "lost"

            async with anyio.create_task_group() as tg:
                tg.start_soon(act, "approve", client.approve(job, call=f"{job}/0/0"))
                tg.start_soon(act, "cancel", other.cancel(job))
        row = await client.get(job)
        if outcomes["cancel"] == "won":  # a cancel after the approval still ends it: FAILED, fenced
            assert row.status == JobStatus.FAILED and row.attempt == 2
        else:
            assert outcomes == {"approve": "won", "cancel": "lost"}
        assert outcomes["approve"] == "won" or row.status == JobStatus.FAILED


async def test_an_approval_names_the_call_it_means_or_none(client: Client, worker: CheckpointStore) -> None:
    await client.start(AGENT, None, job_id="asks")
    await worker.claim("asks", 1)
    await worker.request_approval("asks", 1, ApprovalRequest("asks/0/1", "d", "pay", "{}", 1.0))
    with pytest.raises(JobStateConflict, match="not the call given by call="):
        await client.approve("asks", call="asks/0/0")
    assert (await client.get("asks")).status == JobStatus.WAITING_FOR_APPROVAL
    assert (await client.reject("asks", "  no  ")).status == JobStatus.FAILED
    with pytest.raises(JobFailed, match="ApprovalRejected: no"):
        await client.result("asks")
    with pytest.raises(JobStateConflict):  # a rejected call is never approved afterwards
        await client.approve("asks")


# -- secrets in what the client says -----------------------------------------------------------------------


async def test_a_crash_message_holding_a_secret_is_masked_in_the_error(
    monkeypatch: pytest.MonkeyPatch, url: str, worker: CheckpointStore
) -> None:
    secret = "sk-ant-api03-" + "Q" * 40
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)
    async with await Client.connect(url) as client:
        await client.start(AGENT, {"password": "hunter2"}, job_id="leaky")
        record = {"exit_code": 1, "error_class": "AuthError", "message": f"key {secret} refused"}
        await finish(worker, "leaky", 1, JobStatus.FAILED, error=record)
        with pytest.raises(JobFailed) as caught:
            await client.result("leaky")
        with pytest.raises(JobStateConflict) as conflict:
            await client.start(AGENT, {"password": "hunter3"}, job_id="leaky")
    assert secret not in str(caught.value) and "AuthError" in str(caught.value)
    assert "hunter" not in str(conflict.value)


# -- the blocking facade -----------------------------------------------------------------------------------


def test_the_blocking_client_works_from_plain_threads(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentlife.db'}"
    backend = Backend("sqlite", str(tmp_path / "agentlife.db"), TableNames())

    async def make_schema_and_finish(job_id: str | None) -> None:
        store = backend.open_store()
        await store.open()
        try:
            await store.init_schema()
            if job_id is not None:
                await finish(store, job_id, 1, JobStatus.COMPLETED, result={"from": "worker"})
        finally:
            await store.close()

    anyio.run(make_schema_and_finish, None)
    client = BlockingClient.connect(url)
    answers: list[Any] = []
    errors: list[BaseException] = []

    def handler(n: int) -> None:  # what a sync web framework's view does, on its own thread
        try:
            job = client.start(AGENT, {"n": n}, job_id=f"sync-{n}")
            assert client.get(job.job_id).status == "PENDING"
            answers.append(client.result(job.job_id, timeout=60))
        except BaseException as exc:  # reported below: an assertion in a thread is lost otherwise
            errors.append(exc)

    threads = [threading.Thread(target=handler, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    while len(client.list().jobs) < 3 and not errors:
        time.sleep(0.01)
    for n in range(3):
        anyio.run(make_schema_and_finish, f"sync-{n}")
    for thread in threads:
        thread.join(60)
    assert errors == [] and answers == [{"from": "worker"}] * 3
    with pytest.raises(ConfigError, match="payload"):
        client.start(AGENT, {1, 2})
    client.close()
    client.close()  # twice is fine
    with pytest.raises(ConfigError, match="closed"):
        client.get("sync-0")


async def test_the_end_of_a_job_wakes_a_postgresql_wait_by_notification(postgres_url: str) -> None:
    backend = Backend("postgresql", postgres_url, TableNames())
    store = backend.open_store()
    await store.open()
    await store.init_schema()
    listener = store.end_listener()  # type: ignore[attr-defined]
    try:
        await store.create_job("ends", AGENT, None)
        await store.create_job("other", AGENT, None)
        assert await listener.wait("ends", 30)  # the LISTEN opens: read the row once
        woken: list[bool] = []
        async with anyio.create_task_group() as tg:

            async def wait() -> None:
                woken.append(await listener.wait("ends", 30))

            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            await finish(store, "other", 1, JobStatus.COMPLETED)  # another job's end wakes no one
            await finish(store, "ends", 1, JobStatus.RUNNING)  # nor a status that is no end
            assert woken == []
            await store.set_status("ends", 1, JobStatus.COMPLETED, result=1)
        assert woken == [True]
    finally:
        await listener.close()
        await store.close()


async def test_an_end_announced_between_the_read_and_the_wait_is_not_missed(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentlife._client import _wait

    monkeypatch.setattr(_wait, "NOTIFIED_POLL_SECONDS", 3600.0)  # a lost notification would hang the wait
    backend = Backend("postgresql", postgres_url, TableNames())
    async with opened(backend, postgres_url) as (worker, client):
        await client.start(AGENT, None, job_id="warm")
        async with anyio.create_task_group() as tg:  # a wait opens the LISTEN connection
            tg.start_soon(client.result, "warm")
            await anyio.sleep(0.5)
            await finish(worker, "warm", 1, JobStatus.COMPLETED)
        await client.start(AGENT, None, job_id="racy")
        store: Any = client._store
        read = store.get_job

        async def get_job(job_id: str) -> Any:
            row = await read(job_id)
            if job_id == "racy" and row.status == JobStatus.PENDING:
                await finish(worker, "racy", 1, JobStatus.COMPLETED, result="ended meanwhile")
                await anyio.sleep(0.3)  # its notification arrives before the wait begins
            return row

        store.get_job = get_job
        with anyio.fail_after(8):  # woken by the notification kept for it, not by the (patched) poll
            assert await client.result("racy") == "ended meanwhile"


# -- rows written by someone else ------------------------------------------------------------------------


async def test_rows_another_writer_left_answer_in_one_line_and_never_as_a_result(
    client: Client, worker: CheckpointStore, backend: Backend
) -> None:
    await client.start(AGENT, None, job_id="garbled")
    await finish(worker, "garbled", 1, JobStatus.FAILED)
    await backend.raw("UPDATE job SET error = '[1, \"text\", null]' WHERE id = 'garbled'")
    with pytest.raises(JobFailed) as caught:
        await client.result("garbled", timeout=math.inf)
    assert caught.value.last_error is None and str(caught.value) == "job garbled ended FAILED on attempt 1"
    await client.start(AGENT, None, job_id="odd")
    await backend.raw("UPDATE job SET status = 'PAUSED_BY_HAND' WHERE id = 'odd'")  # a status of no version
    with pytest.raises(ResultTimeout) as timed_out:
        await client.result("odd", timeout=0.05)
    assert timed_out.value.status == "PAUSED_BY_HAND"
    assert (await client.get("odd")).status == "PAUSED_BY_HAND"
    got: list[BaseException] = []
    async with anyio.create_task_group() as tg:

        async def wait() -> None:
            try:
                await client.result("odd", timeout=30)
            except JobNotFound as exc:
                got.append(exc)

        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        # A retention job removed it meanwhile: no end is announced, the wait's next read finds it gone.
        await backend.raw("DELETE FROM job WHERE id = 'odd'")
    assert [str(e) for e in got] == ["job odd does not exist"]


async def test_a_start_on_a_row_whose_payload_cannot_be_read_is_a_conflict(tmp_path: Path) -> None:
    backend = Backend("sqlite", str(tmp_path / "torn.db"), TableNames())
    async with opened(backend, f"sqlite:///{backend.location}") as (_, client):
        await client.start(AGENT, {"a": 1}, job_id="torn")
        await backend.raw("UPDATE job SET payload = X'00FF' WHERE id = 'torn'")
        with pytest.raises(JobStateConflict, match="stored payload cannot be read"):
            await client.start(AGENT, {"a": 1}, job_id="torn")
        assert "payload" in (await client.get("torn")).unreadable


async def test_a_refused_postgresql_login_is_one_line_without_the_password(postgres_server: Any) -> None:
    password = "wr ong%20pa'ss\"word"
    url = postgres_server.url("postgres").replace(postgres_server.password, password)
    with pytest.raises(StoreError) as caught:
        await Client.connect(url)
    text = str(caught.value)
    assert "refused" in text and "\n" not in text
    assert "wr ong" not in text and "pa'ss" not in text
    with pytest.raises(StoreError, match="db init") as no_schema:  # at connect, not at the first request
        await Client.connect(postgres_server.create_schema())
    assert "\n" not in str(no_schema.value)


def test_a_blocking_client_that_cannot_connect_leaves_no_thread_behind(tmp_path: Path) -> None:
    before = threading.active_count()
    for url in ("sqlite://", f"sqlite:///{tmp_path / 'missing.db'}"):
        with pytest.raises((ConfigError, StoreError)):
            BlockingClient.connect(url)
    deadline = time.monotonic() + 10  # anyio's worker threads leave just after the loop they served ends
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before


async def test_a_result_wait_outlives_a_database_restart(postgres_server: Any) -> None:
    url = postgres_server.create_schema()
    backend = Backend("postgresql", url, TableNames())
    worker = backend.open_store()
    await worker.open()
    await worker.init_schema()
    try:
        async with await Client.connect(url) as client:
            await client.start(AGENT, None, job_id="outlived")

            async def restart_then_end() -> None:
                await anyio.to_thread.run_sync(postgres_server.stop)  # the wait's reads fail meanwhile
                await anyio.sleep(1.5)
                await anyio.to_thread.run_sync(postgres_server.start)
                await finish(worker, "outlived", 1, JobStatus.COMPLETED, result="after the restart")

            assert await result_while(client, "outlived", restart_then_end()) == "after the restart"
    finally:
        postgres_server.start()
        await worker.close()


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(
        [1e16, -0.0, 1.2345678901234568e17, 1e300, 1.5e-320]
    )  # jsonb gives these back rewritten
    | st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=8),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


async def test_any_json_payload_started_twice_is_one_job_never_a_conflict(client: Client) -> None:
    # The second start compares the payload the store gives back (PostgreSQL's jsonb rewrites numbers and
    # key order) with the one given: a value both stores keep must always read as the same job.
    seen = 0

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(payload=JSON_VALUES)
    def check(payload: Any) -> None:
        nonlocal seen
        seen += 1
        job_id = f"json-{seen}"

        async def twice() -> None:
            first = await client.start(AGENT, payload, job_id=job_id)
            again = await client.start(AGENT, payload, job_id=job_id)
            assert first == again

        anyio.from_thread.run(twice)

    await anyio.to_thread.run_sync(check)


def test_the_blocking_client_answers_inside_a_sync_wsgi_view(tmp_path: Path) -> None:
    import json
    import urllib.error
    import urllib.request
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    backend = Backend("sqlite", str(tmp_path / "agentlife.db"), TableNames())

    async def make_schema() -> None:
        store = backend.open_store()
        await store.open()
        await store.init_schema()
        await store.close()

    anyio.run(make_schema)

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    with BlockingClient.connect(f"sqlite:///{backend.location}") as client:

        def view(environ: dict[str, Any], respond: Any) -> list[bytes]:  # a Flask/Django-style sync view
            job_id = environ["PATH_INFO"].strip("/")
            try:
                job = client.start(AGENT, {"from": "web"}, job_id=job_id)
                body, status = {"job": job.job_id, "status": client.get(job.job_id).status}, "200 OK"
            except ConfigError as exc:
                body, status = {"error": str(exc)}, "400 Bad Request"
            respond(status, [("Content-Type", "application/json")])
            return [json.dumps(body).encode()]

        server = make_server("127.0.0.1", 0, view, handler_class=Quiet)
        serving = threading.Thread(target=server.serve_forever, daemon=True)
        serving.start()
        try:
            base = f"http://127.0.0.1:{server.server_port}"
            with urllib.request.urlopen(f"{base}/web-1", timeout=30) as answer:
                assert json.loads(answer.read()) == {"job": "web-1", "status": "PENDING"}
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{base}/bad%20id", timeout=30)
            assert refused.value.code == 400
            assert "is not allowed" in json.loads(refused.value.read())["error"]
        finally:
            server.shutdown()
            server.server_close()
        assert [job.job_id for job in client.list().jobs] == ["web-1"]


# -- following a job ---------------------------------------------------------------------------------------


async def test_events_follow_a_job_to_its_end_and_a_rejoin_misses_nothing_and_repeats_nothing(
    client: Client, worker: CheckpointStore
) -> None:
    await client.start(AGENT, job_id="followed-1")
    seen: list[tuple[str, str, Any]] = []

    async def follow() -> None:
        async with client.events("followed-1") as events:
            async for event in events:
                seen.append((event.kind, event.name, event.value))
                if event.kind == "published" and event.value == {"n": 1}:
                    return  # the follower leaves mid-job; it rejoins below with its cursor
        raise AssertionError("the follower should have left after the first progress event")

    async def run_the_job() -> None:
        await worker.claim("followed-1", 1)
        await worker.publish_output("followed-1", 1, "call-1", "progress", b'{"n": 1}')
        await worker.publish_output("followed-1", 1, "call-2", "progress", b'{"n": 2}')
        await worker.publish_output("followed-1", 1, "call-1", "progress", b'{"n": 1}')  # a replay: kept once
        await worker.set_status("followed-1", 1, JobStatus.COMPLETED, result={"ok": True})

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await anyio.wait_all_tasks_blocked()
        await run_the_job()
    cursor = None
    async with client.events("followed-1", live=False) as events:  # the whole record, to find the cursor
        async for event in events:
            if event.kind == "published" and event.value == {"n": 1}:
                cursor = event.cursor
    assert cursor is not None
    rest = [(e.kind, e.name, e.value) async for e in client.events("followed-1", after=cursor)]
    published = [value for kind, _, value in seen + rest if kind == "published"]
    assert published == [{"n": 1}, {"n": 2}]  # each once, across the leave and the rejoin
    assert rest[-1][:2] == ("end", "COMPLETED")
    with pytest.raises(ConfigError, match="cursor"):
        client.events("followed-1", after=cursor.replace(".", ".x"))
    with pytest.raises(JobNotFound):
        await anext(aiter(client.events("nobody-here")))
    with pytest.raises(ConfigError):
        client.events("bad id\n")


def test_the_blocking_client_follows_a_job_and_closes_a_follower_left_early(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentlife.db'}"
    backend = Backend("sqlite", str(tmp_path / "agentlife.db"), TableNames())

    async def job_that_publishes_and_ends() -> None:
        store = backend.open_store()
        await store.open()
        try:
            await store.init_schema()
            await store.create_job("sync-follow", AGENT, None)
            await store.claim("sync-follow", 1)
            for n in range(3):
                await store.publish_output("sync-follow", 1, f"call-{n}", "progress", b'{"n": %d}' % n)
            await store.set_status("sync-follow", 1, JobStatus.COMPLETED, result=None)
        finally:
            await store.close()

    anyio.run(job_that_publishes_and_ends)
    with BlockingClient.connect(url) as client:
        kinds = [event.kind for event in client.events("sync-follow")]
        assert kinds.count("published") == 3 and kinds[-1] == "end"
        for event in client.events("sync-follow"):
            if event.kind == "published":
                first = event
                break  # leaving early closes the follower on the client's loop
        values = [e.value for e in client.events("sync-follow", after=first.cursor) if e.kind == "published"]
        assert values == [{"n": 1}, {"n": 2}]
        with pytest.raises(ConfigError, match="cursor"):
            client.events("sync-follow", after="garbage")


async def test_a_start_carries_the_jobs_concurrency_key_and_priority_and_refuses_bad_ones(
    client: Client, backend: Backend
) -> None:
    await client.start(AGENT, {"n": 1}, job_id="keyed-1", concurrency_key="tenant-a", priority=5)
    job = await client.get("keyed-1")
    assert (job.concurrency_key, job.priority) == ("tenant-a", 5)
    assert (await client.get((await client.start(AGENT)).job_id)).priority == 0
    rows = await count_rows(backend)
    for bad in (
        {"priority": 1001},
        {"priority": True},
        {"concurrency_key": "a\x00b"},
        {"concurrency_key": ""},
    ):
        with pytest.raises(ConfigError):
            await client.start(AGENT, job_id="keyed-2", **bad)
    assert await count_rows(backend) == rows  # nothing written


def test_a_script_that_never_closes_its_blocking_client_still_exits(tmp_path: Path) -> None:
    db = tmp_path / "agentlife.db"
    anyio.run(_make_schema, db)
    script = (
        "import sys, agentlife\n"
        f"client = agentlife.BlockingClient.connect({f'sqlite:///{db}'!r})\n"
        "client.start('app-agent', job_id='left-open')\n"
        "print('started', flush=True)\n"
        "raise SystemExit(3)  # no close(): an exception between connect and close does the same\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (3, "started\n"), done.stderr


def test_closing_a_blocking_client_ends_the_calls_other_threads_wait_in(tmp_path: Path) -> None:
    db = tmp_path / "agentlife.db"
    anyio.run(_make_schema, db)
    client = BlockingClient.connect(f"sqlite:///{db}")
    client.start(AGENT, job_id="never-ends")
    errors: list[BaseException] = []

    def wait_for_ever() -> None:
        try:
            client.result("never-ends")
        except BaseException as exc:
            errors.append(exc)

    def follow_for_ever() -> None:
        try:
            for _ in client.events("never-ends"):
                pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wait_for_ever), threading.Thread(target=follow_for_ever)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)  # both calls are waiting on the client's loop by now (nothing here depends on it)
    closer = threading.Thread(target=client.close)
    closer.start()
    closer.join(30)
    assert not closer.is_alive(), "close() waited for the calls other threads were waiting in"
    for thread in threads:
        thread.join(30)
    assert len(errors) == 2 and all(isinstance(e, ConfigError) and "closed" in str(e) for e in errors), errors


async def _make_schema(db: Path) -> None:
    store = Backend("sqlite", str(db), TableNames()).open_store()
    await store.open()
    try:
        await store.init_schema()
    finally:
        await store.close()


@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_client_used_from_another_event_loop_is_one_clear_error(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import asyncio

    if kind == "sqlite":
        db = tmp_path / "agentlife.db"
        anyio.run(_make_schema, db)
        url = f"sqlite:///{db}"
    else:
        url = request.getfixturevalue("postgres_url")
        anyio.run(_make_pg_schema, url)
    client = asyncio.run(Client.connect(url))  # that loop ends here
    with pytest.raises(ConfigError, match="event loop that connected it"):
        asyncio.run(client.get("any-job"))
    with pytest.raises(ConfigError, match="event loop that connected it"):
        asyncio.run(client.start(AGENT))
    asyncio.run(client.close())  # marks it closed: what it held belonged to the ended loop
    with pytest.raises(ConfigError, match="closed"):
        asyncio.run(client.get("any-job"))
    del client
    gc.collect()  # the ended loop's connections are collected here, under this test's warning filters


async def _make_pg_schema(url: str) -> None:
    store = Backend("postgresql", url, TableNames()).open_store()
    await store.open()
    try:
        await store.init_schema()
    finally:
        await store.close()


async def test_a_timeout_that_ends_inside_a_short_outage_is_a_result_timeout() -> None:
    from agentlife._client._wait import wait_for_end

    class Unreachable:  # the store as an outage shows it: every read fails, the wait goes on
        async def get_job(self, job_id: str) -> None:
            raise StoreUnavailable("the database cannot be reached")

    with pytest.raises(ResultTimeout, match="cannot be reached") as caught:
        await wait_for_end(Unreachable(), "some-job", 0.2, None)  # type: ignore[arg-type]
    assert isinstance(caught.value, TimeoutError)
    assert isinstance(caught.value.__cause__, StoreUnavailable)


async def test_a_large_payload_is_checked_off_the_event_loop_a_small_one_on_it(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentlife._client._client as client_module

    threads: list[threading.Thread] = []
    real_check = client_module.check_start

    def watched(*args: Any) -> Any:
        threads.append(threading.current_thread())
        return real_check(*args)

    monkeypatch.setattr(client_module, "check_start", watched)
    await client.start(AGENT, {"small": 1})
    await client.start(AGENT, [{}] * 20_000)  # 60 KB of JSON: ~0.2 s of walking, the loop stays free
    assert threads[0] is threading.main_thread() and threads[1] is not threading.main_thread()


async def test_each_action_records_its_actor_default_user_at_host_and_get_shows_it(
    client: Client, worker: CheckpointStore
) -> None:
    await client.start(AGENT, None, job_id="who")
    await client.cancel("who", "stop", actor="alice (sre)")
    await client.retry("who")
    for bad in ("", "a\nb", "x" * 201, "\u202eadmin", 7):
        with pytest.raises(ConfigError, match="actor"):
            await client.cancel("who", actor=bad)  # type: ignore[arg-type]
    errors = (await client.get("who")).errors
    assert [(e.get("error_class") or e.get("event"), e["actor"]) for e in errors] == [
        ("Cancelled", "alice (sre)"),
        ("retry", default_actor()),
    ]
    assert (await client.get("who")).status == JobStatus.PENDING
