"""The retention pass (``AGENTLIFE_RETAIN_*``): what a worker's reaper pass prunes, and which journals go.

In-process, on a real SQLite store: the pass itself, the journals it may and may not remove, a store that
cannot answer (nothing removed), one in-process worker whose first reaper pass applies the policy, and the
settings' boot errors.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentlife import AgentProcess, Done, StepContext
from agentlife._exceptions import ConfigError, InvariantViolation, StoreUnavailable
from agentlife._manifest import constants_env
from agentlife._runtime._retention import apply_retention
from agentlife._runtime._worker import ShellOptions, Worker, WorkerOptions
from agentlife.constants import Constants, RetentionConstants
from agentlife.stores import SQLiteStore

pytestmark = pytest.mark.anyio

DAY = 86400.0
POLICY = RetentionConstants(completed_days=1.0)


async def _finished(store: SQLiteStore, job_id: str, status: str, *, age_days: float) -> None:
    await store.create_job(job_id, "keeper", {})
    await store.claim(job_id, 1)
    if status != "RUNNING":
        await store.set_status(job_id, 1, status)
    await store._db.run(_age, job_id, time.time() - age_days * DAY)


async def _age(tx: Any, job_id: str, at: float) -> None:
    # Through the store's own connection: a finished row last written ``at``.
    tx.connection.execute("UPDATE job SET updated_at = ? WHERE id = ?", (at, job_id))


def _journal(data_dir: Path, name: str, *, age_days: float = 2.0) -> Path:
    path = data_dir / "sessions" / name
    path.mkdir(parents=True)
    (path / "1-1.jsonl").write_text("{}\n")
    then = time.time() - age_days * DAY
    os.utime(path, (then, then))
    return path


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    opened = SQLiteStore(tmp_path / "agentlife.db")
    await opened.open()
    yield opened
    await opened.close()


async def test_the_pass_prunes_past_the_period_and_removes_only_pruned_jobs_journals(
    store: SQLiteStore, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    await _finished(store, "old-done", "COMPLETED", age_days=2)
    await _finished(store, "young-done", "COMPLETED", age_days=0.5)
    await _finished(store, "old-failed", "FAILED", age_days=2)  # no FAILED period: kept for ever
    await _finished(store, "old-running", "RUNNING", age_days=2)
    gone = _journal(data, "old-done")
    kept = [_journal(data, name) for name in ("young-done", "old-failed", "old-running", "never-stored")]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (data / "sessions" / "linked").symlink_to(outside)
    fresh = _journal(data, "fresh", age_days=0)  # no tombstone: kept however young

    done = await apply_retention(store, POLICY, data)

    assert done.pruned == ("old-done",) and done.journals == 1
    assert not gone.exists()
    assert all((path / "1-1.jsonl").exists() for path in [*kept, fresh])
    assert outside.exists() and (data / "sessions" / "linked").is_symlink()
    assert {j.id for j in await store.list_jobs()} == {"young-done", "old-failed", "old-running"}


async def test_no_policy_prunes_nothing_and_touches_no_journal(store: SQLiteStore, tmp_path: Path) -> None:
    await _finished(store, "old-done", "COMPLETED", age_days=400)
    journal = _journal(tmp_path / "data", "old-done")
    done = await apply_retention(store, RetentionConstants(), tmp_path / "data")
    assert (done.pruned, done.journals) == ((), 0)
    assert journal.exists() and await store.get_job("old-done") is not None


async def test_without_a_policy_the_pass_removes_journals_of_jobs_pruned_by_hand_and_expires_tombstones(
    store: SQLiteStore, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    await _finished(store, "by-hand", "COMPLETED", age_days=2)
    await _finished(store, "long-ago", "COMPLETED", age_days=500)
    # A `job prune` on another pod: the store's rows go, this pod's journals stay (one written just now).
    await store.prune_jobs(older_than=DAY, statuses=["COMPLETED"])
    journal = _journal(data, "by-hand", age_days=0)
    await store._db.run(_tombstone_age, "long-ago", time.time() - 400 * DAY)

    done = await apply_retention(store, RetentionConstants(), data)

    assert (done.pruned, done.journals, done.tombstones) == ((), 1, 1)
    assert not journal.exists()
    assert await store.pruned_job("long-ago") is None  # past AGENTLIFE_RETAIN_PRUNED_IDS_DAYS (365)
    assert await store.pruned_job("by-hand") is not None


async def test_a_job_the_pass_prunes_loses_its_journal_however_recently_written(
    store: SQLiteStore, tmp_path: Path
) -> None:
    await _finished(store, "old-done", "COMPLETED", age_days=2)
    journal = _journal(tmp_path / "data", "old-done", age_days=0)
    done = await apply_retention(store, POLICY, tmp_path / "data")
    assert (done.pruned, done.journals) == (("old-done",), 1) and not journal.exists()


async def _tombstone_age(tx: Any, job_id: str, at: float) -> None:
    tx.connection.execute("UPDATE job_pruned SET pruned_at = ? WHERE id = ?", (at, job_id))


class _Down(SQLiteStore):
    async def pruned_ids(self, job_ids: Sequence[str]) -> set[str]:
        raise StoreUnavailable("the database is down")


async def test_a_store_that_cannot_answer_removes_no_journal(tmp_path: Path) -> None:
    store = _Down(tmp_path / "agentlife.db")
    await store.open()
    try:
        await _finished(store, "old-done", "COMPLETED", age_days=2)
        await store.prune_jobs(older_than=DAY, statuses=["COMPLETED"])  # pruned by another pod, say
        journal = _journal(tmp_path / "data", "old-done")
        with pytest.raises(StoreUnavailable):
            await apply_retention(store, POLICY, tmp_path / "data")
        assert (journal / "1-1.jsonl").exists()
    finally:
        await store.close()


class _Idle(AgentProcess):
    agent_id = "keeper"

    async def step(self, ctx: StepContext) -> Done | None:
        return Done(result=None)


async def test_a_workers_reaper_pass_applies_the_policy(store: SQLiteStore, tmp_path: Path) -> None:
    data = tmp_path / "data"
    await _finished(store, "old-done", "COMPLETED", age_days=2)
    await _finished(store, "young-done", "COMPLETED", age_days=0.5)
    journal = _journal(data, "old-done")
    env = {
        "AGENTLIFE_DATA_DIR": str(data),
        "AGENTLIFE_DATABASE_URL": f"sqlite:///{tmp_path / 'agentlife.db'}",
        "AGENTLIFE_HEALTH_PORT": "off",
    }
    options = WorkerOptions(
        idle_timeout=0.3,
        poll_interval=0.01,
        max_poll_interval=0.05,
        constants=Constants(retention=POLICY).scaled(0.01),
        shell=ShellOptions(handle_signals=False, hard_exit=False, probes=False, log_stream=io.StringIO()),
        concurrency=1,
    )
    with anyio.fail_after(60):
        await Worker(_Idle, env=env, options=options).run()
    assert await store.get_job("old-done") is None and await store.pruned_job("old-done") is not None
    assert await store.get_job("young-done") is not None
    assert not journal.exists()


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf", "0.5", "40000", "thirty", ""])
def test_a_bad_period_is_a_one_line_boot_error(raw: str) -> None:
    with pytest.raises((ConfigError, InvariantViolation)) as caught:
        Constants.from_env({"AGENTLIFE_RETAIN_DEAD_LETTER_DAYS": raw})
    assert "AGENTLIFE_RETAIN_DEAD_LETTER_DAYS" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("raw", ["1_0", "\uff11\uff10", "\u0661\u0660"])
def test_a_period_written_other_than_in_ascii_digits_is_refused(raw: str) -> None:
    # Python's float() reads each of these as 10: a typo or a pasted glyph must not become a period.
    with pytest.raises(ConfigError, match=r"AGENTLIFE_RETAIN_FAILED_DAYS=.* is not a number of days"):
        Constants.from_env({"AGENTLIFE_RETAIN_FAILED_DAYS": raw})


FOR_EVER = "leave it unset to keep these jobs for ever"


@pytest.mark.parametrize(
    ("name", "raw", "says"),
    [
        ("AGENTLIFE_RETAIN_FAILED_DAYS", "-1", f"from 1 to 36500 ({FOR_EVER})"),
        ("AGENTLIFE_RETAIN_FAILED_DAYS", "0", f"from 1 to 36500 ({FOR_EVER})"),
        ("AGENTLIFE_RETAIN_PRUNED_IDS_DAYS", "0", "from 1 to 36500 (unset: 365 days)"),
        ("AGENTLIFE_RETAIN_PRUNED_IDS_DAYS", "-1", "from 1 to 36500 (unset: 365 days)"),
    ],
)
def test_a_period_out_of_range_says_the_range_and_what_unset_means(name: str, raw: str, says: str) -> None:
    with pytest.raises((ConfigError, InvariantViolation)) as caught:
        Constants.from_env({name: raw})
    assert says in str(caught.value), str(caught.value)


def test_the_periods_are_off_by_default_and_the_manifest_carries_those_set() -> None:
    assert Constants().retention.periods() == {}
    env = {"AGENTLIFE_RETAIN_COMPLETED_DAYS": "30", "AGENTLIFE_RETAIN_DEAD_LETTER_DAYS": "90"}
    constants = Constants.from_env(env)
    assert constants.retention.periods() == {"COMPLETED": 30.0, "DEAD_LETTER": 90.0}
    assert constants.scaled(0.01).retention == constants.retention  # days are never scaled
    assert constants_env(constants) == env
