"""``job approve`` / ``job reject`` (real subprocesses) do what a parked agent consumes: a job parked on a
restricted tool carries on, resumes on its next run, or has its call refused."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from procs import agent_env, run_cli
from test_calls_e2e import EFFECTS, PARKING, PLANS, Deployer, _harness, _when_row_status

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _clear_effects() -> None:
    EFFECTS.clear()
    PLANS.clear()


async def _cli(data_dir: Path, *args: str) -> tuple[int, str, str]:
    proc = await anyio.to_thread.run_sync(lambda: run_cli(*args, env=agent_env(data_dir)))
    return proc.returncode, proc.stdout, proc.stderr


async def test_approve_while_the_job_is_parked_lets_the_live_process_carry_on(tmp_path: Path) -> None:
    h = _harness(tmp_path, AGENTLIFE_APPROVAL_POLL_SECONDS="5")  # idle timeout 1800 s -> 18 s
    answers: list[tuple[int, str, str]] = []

    async def approve() -> None:
        await _when_row_status(h.data_dir / "agentlife.db", "job-1", "WAITING_FOR_APPROVAL")
        answers.append(await _cli(h.data_dir, "job", "approve", "job-1"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(approve)
        run = await h.run(Deployer())
    assert answers == [(0, "job job-1 approved: RUNNING (the parked process takes it)\n", "")]
    assert run.exit_code == 0
    assert run.job is not None and (run.job.status, run.job.attempt) == ("COMPLETED", 1)
    assert EFFECTS == ["job-1/0/0"]


async def test_approve_after_the_process_parked_and_exited_resumes_on_the_next_run(tmp_path: Path) -> None:
    h = _harness(tmp_path, **PARKING)
    parked = await h.run(Deployer(plan_first=True))
    assert parked.exit_code == 0 and parked.job is not None and parked.job.status == "WAITING_FOR_APPROVAL"
    assert EFFECTS == []
    code, out, err = await _cli(h.data_dir, "job", "approve", "job-1")
    assert (code, out) == (0, "job job-1 approved: PENDING (the next run resumes it)\n"), err
    resumed = await h.run(Deployer(plan_first=True))
    assert resumed.exit_code == 0
    assert resumed.job is not None and resumed.job.status == "COMPLETED"
    assert EFFECTS == ["job-1/0/1"] and PLANS == ["job-1/0/0"]  # the plan call replayed, not run again
    code, _, err = await _cli(h.data_dir, "job", "approve", "job-1")
    assert code == 4 and "it is COMPLETED" in err


async def test_reject_while_the_job_is_parked_refuses_the_call(tmp_path: Path) -> None:
    h = _harness(tmp_path, AGENTLIFE_APPROVAL_POLL_SECONDS="5")
    answers: list[tuple[int, str, str]] = []

    async def reject() -> None:
        await _when_row_status(h.data_dir / "agentlife.db", "job-1", "WAITING_FOR_APPROVAL")
        answers.append(await _cli(h.data_dir, "job", "reject", "job-1", "--reason", "not in prod"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(reject)
        run = await h.run(Deployer())
    assert answers == [(0, "job job-1 rejected: FAILED\n", "")]
    assert run.exit_code == 1 and EFFECTS == []
    assert run.job is not None and run.job.status == "FAILED"
    assert [e["error_class"] for e in run.job.error] == ["ApprovalRejected", "BackgroundOperationRestricted"]
    assert run.job.error[0]["message"] == "not in prod"
