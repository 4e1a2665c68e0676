"""A `StepContext` on a real journal and store, its calls going to a given `LLMClient` (no process)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson

from agentlife import AgentProcess, Footprint, Job, LLMClient, LLMReply, StepContext
from agentlife._budget import Budget
from agentlife._config import Settings
from agentlife._journal._steprecords import StepJournal
from agentlife._journal._writer import Journal
from agentlife._observe._telemetry_facade import TelemetryFacade
from agentlife._redact import Redactor
from agentlife._step._approvals import Approvals
from agentlife._step._context import CallEnv
from agentlife._step._host import Booted, RuntimeStats
from agentlife.constants import Constants
from agentlife.stores import SQLiteStore

MakeCtx = Callable[..., Awaitable[tuple[StepContext, Journal]]]


@asynccontextmanager
async def step_contexts(tmp_path: Path, *, time_scale: float = 0.01) -> AsyncIterator[MakeCtx]:
    """``make(llm, **env)``: step 0's context whose calls go to ``llm``, time scaled by ``time_scale``."""
    opened: list[tuple[Journal, SQLiteStore]] = []

    async def make(llm: LLMClient, **env: str) -> tuple[StepContext, Journal]:
        constants = Constants.from_env(env).scaled(time_scale)
        attempt = len(opened) + 1  # each context is the next attempt of the job, as a resume is
        settings = Settings.from_env(
            {"AGENTLIFE_DATA_DIR": str(tmp_path), "AGENTLIFE_ATTEMPT": str(attempt)},
            job_id="job-s",
            agent_id="s",
            constants=constants,
        )
        store = SQLiteStore(tmp_path / "agentlife.db")
        await store.open()
        await store.create_job("job-s", "s", {})
        await store.claim("job-s", attempt)  # the step's records go to the store, fenced like a real job's
        journal = Journal.create(settings.session_dir, attempt)
        opened.append((journal, store))
        job = Job("job-s", "s", attempt, {})

        class Host:
            agent = AgentProcess()
            draining = False
            drain_event = None
            drain_deadline = None
            redactor = Redactor()
            stats = RuntimeStats()
            telemetry = TelemetryFacade()

            def __init__(self) -> None:
                self.constants = constants

            def notify(self, event: str, **info: Any) -> None:
                pass

        async def no_usage(reply: LLMReply) -> None:
            pass

        host = Host()
        call_env = CallEnv(
            host,
            Approvals(Booted(settings, store, journal), job, host, lambda: 0),
            no_usage,
            StepJournal(journal, store, "job-s", attempt),
            None,
            Budget.build(constants.budget, None, None),
            llm,
            random.Random(0),
        )
        ctx = StepContext(step=0, state={}, job=job, memories=[], footprint=Footprint(), env=call_env)
        return ctx, journal

    try:
        yield make
    finally:
        for journal, store in opened:
            await journal.aclose()
            await store.close()


async def journal_events(journal: Journal) -> list[dict[str, Any]]:
    """Everything the journal holds so far."""
    await journal.flush()
    return [orjson.loads(line) for line in journal.path.read_bytes().splitlines()]
