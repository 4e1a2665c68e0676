"""A worker never dies of an error in one of its duties: every store call a slot or a background duty
makes can fail (an outage, a driver error no store code wrapped, a bug), and the worker logs it redacted
and goes on, or exits with its documented code. None may escape a task group as an ``ExceptionGroup``.

In-process workers on a real SQLite store whose methods fail on purpose (a subclass that raises before
calling the real method), with real jobs and agents; the JSON log lines are read from the worker's stream.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from agentlife import AgentProcess, Done, StepContext
from agentlife._cli._common import guarded
from agentlife._exceptions import StoreUnavailable
from agentlife._exitcode import ExitCode
from agentlife._runtime import _worker
from agentlife._runtime._worker import ShellOptions, Worker, WorkerOptions
from agentlife.constants import Constants
from agentlife.stores import JobStatus, SQLiteStore

pytestmark = pytest.mark.anyio

AGENT = "duty-agent"
#: Put into every injected error's message; the logs must show it masked.
SECRET = "sk-ant-duty-secret-0123456789abcdef"


class DutyAgent(AgentProcess):
    """One step; a job whose payload says so crashes."""

    agent_id = AGENT

    async def step(self, ctx: StepContext) -> Done | None:
        if ctx.job.payload.get("crash"):
            raise RuntimeError("this job crashes")
        return Done(result={"ok": ctx.job.id})


class FaultyStore(SQLiteStore):
    """A real SQLite store whose named methods raise ``faults[name]`` errors before working again.

    ``faults[name] = n``: the next ``n`` calls raise (``-1``: every call); ``skip[name] = k``: the first
    ``k`` calls work before that (the boot's own query of the job table, say).
    """

    faults: dict[str, int]
    skip: dict[str, int]
    error: Callable[[str], BaseException]
    raised: dict[str, int]

    def _fault(self, name: str) -> None:
        if self.skip.get(name, 0) > 0:
            self.skip[name] -= 1
            return
        left = self.faults.get(name, 0)
        if left == 0:
            return
        if left > 0:
            self.faults[name] = left - 1
        self.raised[name] = self.raised.get(name, 0) + 1
        raise self.error(name)

    async def claim_next(self, agent_id: str | None = None, **_: Any) -> Any:
        self._fault("claim_next")
        return await super().claim_next(agent_id)

    async def wait_for_work(self, agent_id: str, timeout: float) -> bool:
        self._fault("wait_for_work")
        return await super().wait_for_work(agent_id, timeout)

    async def count_runnable(self) -> dict[str, int]:
        self._fault("count_runnable")
        return await super().count_runnable()

    async def reap(self, *args: Any, **kwargs: Any) -> Any:
        self._fault("reap")
        return await super().reap(*args, **kwargs)

    async def drop_claim(self, job_id: str) -> None:
        self._fault("drop_claim")
        await super().drop_claim(job_id)

    async def release(self, *args: Any, **kwargs: Any) -> bool:
        self._fault("release")
        return await super().release(*args, **kwargs)

    async def set_status(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("error") is not None:  # a crash record: another job's end must not take the fault
            self._fault("set_status")
        return await super().set_status(*args, **kwargs)

    async def open(self) -> None:
        self._fault("open")
        await super().open()


def driver_error(name: str) -> BaseException:
    """What a driver raises that no store code wrapped, with a secret in its text."""
    return RuntimeError(f"{name} failed: token={SECRET}")


async def make_jobs(db: Path, jobs: dict[str, dict[str, Any]]) -> None:
    store = SQLiteStore(db)
    await store.open()
    try:
        await store.init_schema()
        for job_id, payload in jobs.items():
            await store.create_job(job_id, AGENT, payload)
    finally:
        await store.close()


async def statuses(db: Path) -> dict[str, tuple[str, int]]:
    store = SQLiteStore(db)
    await store.open()
    try:
        return {r.id: (str(r.status), r.attempt) for r in await store.list_jobs(limit=100)}
    finally:
        await store.close()


async def run_worker(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    faults: dict[str, int],
    *,
    skip: dict[str, int] | None = None,
    error: Callable[[str], BaseException] = driver_error,
    concurrency: int = 2,
    max_jobs: int | None = None,
    idle_timeout: float = 30.0,
    during: Callable[[], Any] | None = None,
) -> tuple[int, list[dict[str, Any]], FaultyStore]:
    """Run one worker in this loop until it exits; (exit code, its JSON log lines, its store)."""
    db = tmp_path / "agentlife.db"
    store = FaultyStore(db)
    store.faults, store.skip, store.error, store.raised = dict(faults), dict(skip or {}), error, {}
    monkeypatch.setattr(_worker, "store_from_url", lambda url, **_: store)
    env = {
        "AGENTLIFE_DATA_DIR": str(tmp_path / "data"),
        "AGENTLIFE_DATABASE_URL": f"sqlite:///{db}",
        "AGENTLIFE_HEALTH_PORT": "off",
        "ANTHROPIC_API_KEY": SECRET,
    }
    stream = io.StringIO()
    options = WorkerOptions(
        idle_timeout=idle_timeout,
        max_jobs=max_jobs,
        poll_interval=0.01,
        max_poll_interval=0.05,
        constants=Constants().scaled(0.01),
        shell=ShellOptions(handle_signals=False, hard_exit=False, probes=False, log_stream=stream),
        concurrency=concurrency,
    )
    worker = Worker(DutyAgent, env=env, options=options)
    code = -1

    async def go() -> None:
        nonlocal code
        code = await worker.run()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(go)
            if during is not None:
                await during()
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]
    return code, lines, store


def messages(lines: list[dict[str, Any]]) -> str:
    return "\n".join(str(line.get("msg", "")) + " " + str(line.get("exc_info", "")) for line in lines)


def assert_redacted(lines: list[dict[str, Any]]) -> None:
    text = orjson.dumps(lines).decode()
    assert SECRET not in text
    assert "ExceptionGroup" not in text


# -- each duty failing -------------------------------------------------------------------------------


@pytest.mark.parametrize("duty", ["claim_next", "drop_claim"])
async def test_a_store_error_in_a_slots_call_is_logged_and_the_jobs_still_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, duty: str
) -> None:
    await make_jobs(tmp_path / "agentlife.db", {f"j{i}": {} for i in range(4)})
    code, lines, store = await run_worker(tmp_path, monkeypatch, {duty: 2}, max_jobs=4)
    assert code == ExitCode.DONE, messages(lines)
    assert store.raised[duty] == 2
    final = await statuses(tmp_path / "agentlife.db")
    assert {job: status for job, (status, _) in final.items()} == dict.fromkeys(final, JobStatus.COMPLETED)
    assert_redacted(lines)


async def test_a_crashed_job_whose_crash_record_cannot_be_written_is_settled_and_the_pool_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The step raises, then recording the crash on the row fails with an error no store code wrapped:
    # the engine's crash path must not let it out of the job (nor the job's error out of the slot).
    await make_jobs(tmp_path / "agentlife.db", {"poison": {"crash": True}, "fine": {}})
    code, lines, store = await run_worker(tmp_path, monkeypatch, {"set_status": 1}, max_jobs=2)
    assert code == ExitCode.DONE, messages(lines)
    assert store.raised == {"set_status": 1}
    final = await statuses(tmp_path / "agentlife.db")
    assert final["fine"] == (JobStatus.COMPLETED, 1)
    assert final["poison"][0] == JobStatus.RETRYING  # settled by the worker: crash recorded, retry decided
    assert "could not record the crash on the job row: RuntimeError: set_status failed" in messages(lines)
    assert_redacted(lines)


async def test_a_crashed_job_whose_release_fails_is_left_to_the_reaper_and_the_pool_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await make_jobs(tmp_path / "agentlife.db", {"poison": {"crash": True}, "fine": {}})
    code, lines, store = await run_worker(tmp_path, monkeypatch, {"release": 1}, max_jobs=2)
    assert code == ExitCode.DONE, messages(lines)
    assert store.raised == {"release": 1}
    final = await statuses(tmp_path / "agentlife.db")
    assert final["fine"] == (JobStatus.COMPLETED, 1)
    assert final["poison"] == (JobStatus.RUNNING, 1)  # its heartbeat stopped: the reaper's from here
    assert "could not settle crashed job poison: RuntimeError: release failed" in messages(lines)
    assert_redacted(lines)


async def test_a_wait_for_work_that_fails_every_time_degrades_to_polling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "agentlife.db"
    await make_jobs(db, {})

    async def later() -> None:
        await anyio.sleep(0.3)  # the slots are idle and waiting by now
        await make_jobs(db, {"late-1": {}, "late-2": {}})

    code, lines, store = await run_worker(
        tmp_path, monkeypatch, {"wait_for_work": -1}, max_jobs=2, during=later
    )
    assert code == ExitCode.DONE, messages(lines)
    assert store.raised["wait_for_work"] >= 1
    assert {s for s, _ in (await statuses(db)).values()} == {JobStatus.COMPLETED}
    assert "waiting for work: RuntimeError: wait_for_work failed" in messages(lines)
    assert_redacted(lines)


@pytest.mark.parametrize("duty", ["reap", "count_runnable"])
async def test_a_background_duty_that_always_fails_only_skips_its_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, duty: str
) -> None:
    await make_jobs(tmp_path / "agentlife.db", {"a": {}, "b": {}, "c": {}})

    async def later() -> None:
        await anyio.sleep(0.3)  # several passes of each duty have failed by now
        await make_jobs(tmp_path / "agentlife.db", {"d": {}})

    # The boot's own query of the job table (a count) must work: a store that cannot serve jobs is fatal.
    code, lines, store = await run_worker(
        tmp_path, monkeypatch, {duty: -1}, skip={"count_runnable": 1}, max_jobs=4, during=later
    )
    assert code == ExitCode.DONE, messages(lines)
    assert store.raised[duty] >= 2
    assert {s for s, _ in (await statuses(tmp_path / "agentlife.db")).values()} == {JobStatus.COMPLETED}
    assert_redacted(lines)


async def test_a_duty_that_raises_a_base_exception_group_of_errors_is_contained_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a store built on task groups raises: a group, not the error itself.
    def grouped(name: str) -> BaseException:
        return ExceptionGroup("unhandled errors in a TaskGroup", [driver_error(name)])

    await make_jobs(tmp_path / "agentlife.db", {"a": {}, "b": {}})
    code, lines, _ = await run_worker(
        tmp_path,
        monkeypatch,
        {"reap": -1, "claim_next": 1, "drop_claim": 1},
        error=grouped,
        max_jobs=2,
    )
    assert code == ExitCode.DONE, messages(lines)
    # The log names the leaf, not the group's empty summary.
    assert "RuntimeError: reap failed" in messages(lines)
    assert SECRET not in orjson.dumps(lines).decode()


async def test_a_driver_error_opening_the_store_is_the_documented_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await make_jobs(tmp_path / "agentlife.db", {"a": {}})
    code, lines, _ = await run_worker(tmp_path, monkeypatch, {"open": 1}, max_jobs=1)
    assert code == 1
    assert "fatal: store unreachable: RuntimeError: open failed" in messages(lines)
    assert_redacted(lines)


async def test_an_engine_failure_around_one_job_is_that_jobs_crash_not_the_pools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The job's lifecycle itself raises out of `run` (an engine bug): the job is settled as a crash and
    # the next job runs.
    real = _worker.job_run

    def failing(agent: Any, worker: Any, store: Any, row: Any) -> Any:
        job = real(agent, worker, store, row)
        if row.id == "bad":

            async def boom() -> int:
                raise ExceptionGroup("unhandled errors in a TaskGroup", [KeyError(f"k {SECRET}")])

            job.run = boom
        return job

    monkeypatch.setattr(_worker, "job_run", failing)
    await make_jobs(tmp_path / "agentlife.db", {"bad": {}, "good": {}})
    code, lines, _ = await run_worker(tmp_path, monkeypatch, {}, max_jobs=2, concurrency=1)
    assert code == ExitCode.DONE, messages(lines)
    final = await statuses(tmp_path / "agentlife.db")
    assert final["good"] == (JobStatus.COMPLETED, 1)
    assert final["bad"][0] == JobStatus.RETRYING
    assert "job bad: internal error: ExceptionGroup: KeyError" in messages(lines)
    assert_redacted([line for line in lines if "ExceptionGroup" not in str(line.get("msg"))])


# -- the command line's last word ----------------------------------------------------------------------


def test_an_escaped_group_is_one_line_naming_each_leaf(capsys: pytest.CaptureFixture[str]) -> None:
    def fails() -> int:
        raise ExceptionGroup("outer", [ValueError("one\ntwo"), ExceptionGroup("inner", [KeyError("k")])])

    assert guarded(fails) == 1
    err = capsys.readouterr().err
    assert err == "agentlife: internal error: ExceptionGroup: ValueError: one two; KeyError: 'k'\n"


def test_a_group_of_one_agentlife_error_is_reported_as_that_error(capsys: pytest.CaptureFixture[str]) -> None:
    def fails() -> int:
        raise ExceptionGroup("tg", [ExceptionGroup("tg", [StoreUnavailable("db gone")])])

    assert guarded(fails) == 1
    assert capsys.readouterr().err == "agentlife: StoreUnavailable: db gone\n"
