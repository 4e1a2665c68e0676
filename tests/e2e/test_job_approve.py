"""Approvals end to end, with real processes only: ``python -m agentlife run`` and ``worker`` parked on a
restricted call, ``python -m agentlife job approve|reject|retry`` from the outside, SIGKILL where a process
dies. An approval is bound to its call and never lost; a rejection is final; a retry approves nothing."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import anyio
import pytest

import world
from agentlife.stores import ApprovalState
from agentlife.stores._base import _start_ticks
from procs import json_lines

DEPLOYER = "agents.approval_agent:Deployer"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'agentlife.db'}"


class World(world.World):
    """The approvals' world: the deployer agents trace to it and poll their approval every 0.05 s."""

    def __init__(self, tmp_path: Path, url: str) -> None:
        super().__init__(
            tmp_path,
            url,
            trace_variable="APPROVAL_DIR",
            target=DEPLOYER,
            AGENTLIFE_APPROVAL_POLL_SECONDS="0.05",
        )

    def approval(self, job_id: str) -> ApprovalState:
        return self.read(lambda store: store.get_approval(job_id))

    def wait_for_status(self, job_id: str, status: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.row(job_id).status != status:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{job_id} is {self.row(job_id).status}, not {status}")
            time.sleep(0.05)

    def sql(self, statement: str, *args: object) -> None:
        """One statement straight on the table, as a control plane's own SQL would (``$n`` placeholders)."""
        if self.url.startswith("sqlite"):
            import sqlite3

            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), isolation_level=None)
            try:
                for n in range(len(args), 0, -1):
                    statement = statement.replace(f"${n}", "?")
                conn.execute(statement, args)
            finally:
                conn.close()
            return

        async def go() -> None:
            import asyncpg

            conn = await asyncpg.connect(self.url)
            try:
                await conn.execute(statement, *args)
            finally:
                await conn.close()

        anyio.run(go)

    def create(self, job_id: str, agent: str = "deployer") -> None:
        super().create(job_id, agent)


def _journal_types(world: World, job_id: str) -> list[list[str]]:
    """The event types of each session journal of the job, oldest session first."""
    import orjson

    sessions = sorted((world.data_dir / "sessions" / job_id).glob("session_*.jsonl"))
    return [[orjson.loads(line)["type"] for line in s.read_text().splitlines() if line] for s in sessions]


# -- an approval is bound to its call and never lost -------------------------------------------------------


def test_approve_while_the_job_is_parked_lets_the_live_process_carry_on(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    world = World(tmp_path, db_url)
    world.create("job-1")
    proc = world.run("job-1")
    procs.append(proc)
    world.wait_for_status("job-1", "WAITING_FOR_APPROVAL")
    shown = world.job("show", "job-1", "--events", "0")
    assert "waits for   deploy (job-1/0/1, digest " in shown.stdout, shown.stdout
    other = world.job("approve", "job-1", "--call", "job-1/0/9")  # not the call it waits for
    assert (other.returncode, other.stdout) == (4, ""), other.stderr
    assert "it waits for deploy (job-1/0/1, digest " in other.stderr and "job-1/0/9" not in other.stderr
    approved = world.job("approve", "job-1", "--call", "job-1/0/1")
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.startswith(
        "job job-1 approved: RUNNING (the parked process takes it): deploy (job-1/0/1"
    )
    code, out = world.finish(proc)
    assert code == 0, out
    assert world.row("job-1").status == "COMPLETED"
    assert [line.split()[0] for line in world.lines("effects")] == ["job-1/0/1"]


def _parked_then_killed(tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]) -> World:
    """A world whose job-1 parked on its approval, and whose parked process was then SIGKILLed."""
    world = World(tmp_path, db_url)
    world.create("job-1")
    parked = world.run("job-1")
    procs.append(parked)
    world.wait_for_status("job-1", "WAITING_FOR_APPROVAL")
    parked.kill()
    parked.communicate()
    return world


def test_a_parked_process_killed_before_the_approval_loses_nothing(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    # SIGKILL while parked (no idle timeout, no drain: no park checkpoint), then the approval. The park is
    # on the row from its first moment, so the approval binds to the call, the job becomes runnable at once
    # (the parked process is provably gone), and the next attempt runs the approved call without asking.
    world = _parked_then_killed(tmp_path, db_url, procs)
    approved = world.job("approve", "job-1")
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.startswith(
        "job job-1 approved: PENDING (the next run resumes it): deploy (job-1/0/1"
    )
    code, out = world.finish(world.run("job-1", AGENTLIFE_ATTEMPT="2"))
    assert code == 0, out
    row = world.row("job-1")
    assert (row.status, row.attempt, row.error) == ("COMPLETED", 2, [])  # no crash counted
    assert [line.split()[:2] for line in world.lines("effects")] == [["job-1/0/1", "2"]]
    assert len(world.lines("plans")) == 1  # the plan before the park was replayed, not run again
    resumed = _journal_types(world, "job-1")[-1]
    assert "APPROVAL_REQUESTED" not in resumed and "APPROVAL_GRANTED" in resumed  # asked once, not twice


def test_an_approval_survives_an_owner_that_cannot_be_judged_and_the_reaper(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    # The parked process dies in another pod (another host, or a pid namespace this one cannot see): the
    # approval cannot tell it is gone and hands it the row RUNNING. The reaper takes the row once its
    # heartbeat is stale; the worker that resumes the job finds the grant and runs the call without asking.
    world = _parked_then_killed(tmp_path, db_url, procs)
    foreign = f"pod-b:4242:99:0a0b0c0d:{uuid.uuid4()}.4026531836"
    if db_url.startswith("sqlite"):
        world.sql("UPDATE job SET owner = $1, heartbeat_at = $2 WHERE id = 'job-1'", foreign, time.time())
    else:
        world.sql("UPDATE job SET owner = $1, heartbeat_at = now() WHERE id = 'job-1'", foreign)
    approved = world.job("approve", "job-1")
    assert approved.stdout.startswith("job job-1 approved: RUNNING (the parked process takes it)"), approved
    # Scaled: the 300 s zombie threshold is 3 s, the reaper runs every 0.3 s, the first backoff is 0.05 s.
    worker = subprocess.Popen(
        [*_worker_command(DEPLOYER), "--time-scale", "0.01", "--max-jobs", "1"],
        env=world.env(),
        cwd=str(Path(__file__).resolve().parent.parent.parent),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    procs.append(worker)
    code, out = world.finish(worker)
    assert code == 0, out
    row = world.row("job-1")
    assert (row.status, row.attempt) == ("COMPLETED", 2)  # reaped (1) and claimed once (2), not 3
    assert [e["error_class"] for e in row.error] == ["HeartbeatStale"]
    assert [line.split()[::2] for line in world.lines("effects")] == [["job-1/0/1", str(worker.pid)]]
    assert "APPROVAL_REQUESTED" not in _journal_types(world, "job-1")[-1]


def _worker_command(target: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "agentlife", "worker", target]


# -- a rejection is final, and a retry approves nothing ----------------------------------------------------


def test_reject_while_parked_ends_the_job_failed_even_when_the_step_swallows_it(
    tmp_path: Path, sqlite_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    world = World(tmp_path, sqlite_url)
    world.create("job-1")
    proc = world.run("job-1", "agents.approval_agent:SwallowingDeployer")
    procs.append(proc)
    world.wait_for_status("job-1", "WAITING_FOR_APPROVAL")
    rejected = world.job("reject", "job-1", "--reason", "not in prod")
    assert (rejected.returncode, rejected.stdout) == (0, "job job-1 rejected: FAILED\n"), rejected.stderr
    code, out = world.finish(proc)
    assert code == 0, out  # the job reached the status the operator recorded: not a crash
    row = world.row("job-1")
    assert (row.status, row.result) == ("FAILED", None)  # not the step's Done(COMPLETED)
    assert [(e["error_class"], e["message"]) for e in row.error] == [("ApprovalRejected", "not in prod")]
    assert world.lines("effects") == []
    assert len(world.lines("plans")) == 1  # the call after the refusal was refused too
    assert row.checkpoint_id is None  # nothing of the refused step was checkpointed
    assert any(
        "deploy (job-1/0/1) refused, rejected: not in prod" in str(line.get("msg"))
        for line in json_lines(out)
    )


def test_a_tool_agent_whose_call_is_rejected_ends_failed_without_another_model_turn(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    world = World(tmp_path, db_url)
    world.create("job-1")
    proc = world.run("job-1", "agents.approval_agent:ToolDeployer")
    procs.append(proc)
    world.wait_for_status("job-1", "WAITING_FOR_APPROVAL")
    assert world.job("reject", "job-1", "--reason", "no").returncode == 0
    code, out = world.finish(proc)
    assert code == 0, out
    row = world.row("job-1")
    assert row.status == "FAILED"
    assert [e["error_class"] for e in row.error] == ["ApprovalRejected"]  # and no COMPLETED written over it
    assert len(world.lines("model")) == 1  # the refusal never went back to the model as a tool error
    assert world.lines("effects") == [] and world.lines("plans") == []  # nor did the rest of the reply run


def test_reject_then_retry_parks_again_and_never_runs_the_rejected_call(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    world = World(tmp_path, db_url)
    world.create("job-1")
    parking = {"AGENTLIFE_IDLE_TIMEOUT_SECONDS": "0.5"}
    code, out = world.finish(world.run("job-1", **parking))
    assert code == 0 and world.row("job-1").status == "WAITING_FOR_APPROVAL", out
    assert world.job("reject", "job-1", "--reason", "no").returncode == 0
    retried = world.job("retry", "job-1")
    assert retried.returncode == 0, retried.stderr
    # The retried job resumes, reaches the call, and asks again: it does not run it.
    code, out = world.finish(world.run("job-1", AGENTLIFE_ATTEMPT="2", **parking))
    assert code == 0, out
    assert world.row("job-1").status == "WAITING_FOR_APPROVAL"
    assert world.lines("effects") == []
    assert "APPROVAL_REQUESTED" in _journal_types(world, "job-1")[-1]
    assert world.approval("job-1").grants == ()
    # Retry, reject and retry again while nothing runs: still nothing approved.
    assert world.job("reject", "job-1").returncode == 0
    assert world.job("retry", "job-1").returncode == 0
    assert world.job("approve", "job-1").returncode == 4  # PENDING: nothing waits for approval
    # Only an approval given while the call is parked again lets it run, once.
    code, out = world.finish(world.run("job-1", AGENTLIFE_ATTEMPT="3", **parking))
    assert code == 0 and world.row("job-1").status == "WAITING_FOR_APPROVAL", out
    assert world.job("approve", "job-1").returncode == 0
    code, out = world.finish(world.run("job-1", AGENTLIFE_ATTEMPT="4"))
    assert code == 0, out
    assert world.row("job-1").status == "COMPLETED"
    assert [line.split()[:2] for line in world.lines("effects")] == [["job-1/0/1", "4"]]


def test_a_status_set_by_hand_approves_nothing(
    tmp_path: Path, sqlite_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    # The 0.2 way to approve (UPDATE job SET status = 'RUNNING') no longer grants the call: the live
    # process sees no grant for it and asks again, so the row says what it really waits for.
    world = World(tmp_path, sqlite_url)
    world.create("job-1")
    proc = world.run("job-1")
    procs.append(proc)
    world.wait_for_status("job-1", "WAITING_FOR_APPROVAL")
    world.sql("UPDATE job SET status = 'RUNNING' WHERE id = 'job-1'")
    world.wait_for_status("job-1", "WAITING_FOR_APPROVAL")
    assert world.lines("effects") == []
    assert world.job("approve", "job-1").returncode == 0
    code, out = world.finish(proc)
    assert code == 0, out
    assert len(world.lines("effects")) == 1
    assert "without an approval of deploy (job-1/0/1): asking again" in out


def test_a_worker_killed_while_parked_hands_the_approved_call_to_the_next_worker(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    world = World(tmp_path, db_url)
    world.create("job-1")
    first = subprocess.Popen(
        _worker_command(DEPLOYER),
        env=world.env(),
        cwd=str(Path(__file__).resolve().parent.parent.parent),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    procs.append(first)
    world.wait_for_status("job-1", "WAITING_FOR_APPROVAL")
    first.send_signal(signal.SIGKILL)
    first.communicate()
    approved = world.job("approve", "job-1")
    assert "PENDING (the next run resumes it)" in approved.stdout, approved
    second = subprocess.Popen(
        [*_worker_command(DEPLOYER), "--max-jobs", "1"],
        env=world.env(),
        cwd=str(Path(__file__).resolve().parent.parent.parent),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    procs.append(second)
    code, out = world.finish(second)
    assert code == 0, out
    row = world.row("job-1")
    assert (row.status, row.attempt, row.error) == ("COMPLETED", 2, [])
    assert [line.split()[::2] for line in world.lines("effects")] == [["job-1/0/1", str(second.pid)]]


def test_the_owner_token_names_the_pid_namespace(tmp_path: Path, sqlite_url: str) -> None:
    world = World(tmp_path, sqlite_url)
    world.create("job-1")
    gate = world.run("job-1")
    try:
        world.wait_for_status("job-1", "WAITING_FOR_APPROVAL")
        import sqlite3

        conn = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
        (owner,) = conn.execute("SELECT owner FROM job WHERE id = 'job-1'").fetchone()
        conn.close()
        host, pid, ticks, _, namespace = owner.split(":")
        assert (host, int(pid), ticks) == (socket.gethostname(), gate.pid, _start_ticks(gate.pid))
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        assert namespace == f"{boot}.{Path('/proc/self/ns/pid').stat().st_ino}"
    finally:
        gate.kill()
        gate.communicate()
