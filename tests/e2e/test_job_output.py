"""A job's output followed from the test process while real ``run`` processes publish and die around it.

One job, four attempts: each of the first three SIGKILLs itself at another point around a publish (before
it, once the row committed but before the call returned, right after it returned), the last two on another
pod's empty disk; the fourth streams a model reply from a real `FakeAnthropicServer`. A follower in this
process is cut off midway and rejoins with its last cursor. Every published event is seen once, in order,
the status changes and the end among them; the model's text arrives as deltas while it streams; secrets
are masked in both.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from agentlife import ScriptedTurn
from agentlife._output._follow import follow_job
from agentlife.stores import store_from_url
from agentlife.testing import FakeAnthropicServer
from world import World

pytestmark = pytest.mark.anyio

SECRET = "tok-3f9a8b7c6d5e4f3a2b1c"
TEXT = "The answer, written slowly, names " + SECRET + " and goes on: " + "word " * 60 + "and ends."


async def _finish(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    out, err = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=60))
    return proc.returncode, (out + err).decode(errors="replace")


async def test_a_follower_sees_each_event_once_across_kills_rejoins_and_a_streamed_reply(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    go = tmp_path / "go"
    turn = ScriptedTurn.text(TEXT, chunks=8, delay=0.1)
    async with FakeAnthropicServer([turn], api_key="test-key") as server:
        world = await anyio.to_thread.run_sync(
            lambda: World(
                tmp_path,
                db_url,
                trace_variable="OUT_DIR",
                target="agents.output_agent:Publisher",
                OUT_GO=str(go),
                OUT_LLM_URL=server.base_url,
                OUT_API_TOKEN=SECRET,
            )
        )
        await anyio.to_thread.run_sync(world.create, "job-1", "publisher")
        store = store_from_url(db_url)
        await store.open()
        first: list[Any] = []
        second: list[Any] = []
        try:
            with anyio.fail_after(90):
                async with anyio.create_task_group() as tasks:

                    async def follow_until_cut() -> None:
                        async with follow_job(store, "job-1") as events:
                            async for event in events:
                                first.append(event)
                                if event.name == "s1":
                                    return  # the follower goes away (its process died, say)

                    tasks.start_soon(follow_until_cut)
                    outcomes = []
                    for attempt, pod in ((1, None), (2, None), (3, "b")):
                        proc = world.run("job-1", pod=pod, AGENTLIFE_ATTEMPT=str(attempt))
                        procs.append(proc)
                        outcomes.append(await _finish(proc))
                    assert [code for code, _ in outcomes] == [-signal.SIGKILL] * 3, outcomes
                    while not first or first[-1].name != "s1":
                        await anyio.sleep(0.02)
                    last = proc = world.run("job-1", pod="c", AGENTLIFE_ATTEMPT="4")
                    procs.append(last)

                    async def rejoin() -> None:
                        async with follow_job(store, "job-1", first[-1].cursor) as events:
                            async for event in events:
                                second.append(event)
                                if event.kind == "status" and event.name == "RUNNING" and not go.exists():
                                    go.touch()

                    tasks.start_soon(rejoin)
                    await anyio.sleep(0.5)
                    go.touch()  # attempt 4 claimed no new status (RUNNING stays RUNNING): start the stream
                    code, out = await _finish(last)
                    assert code == 0, out
            async with follow_job(store, "job-1", live=False) as events:
                everything = [event async for event in events]
        finally:
            await store.close()
    durable = [e for e in first + second if e.kind != "delta"]
    assert durable == everything  # cut off and rejoined: nothing missed, nothing twice
    assert [(e.kind, e.name) for e in everything] == [
        ("status", "RUNNING"),
        ("published", "s0"),
        ("published", "s1"),
        ("published", "s2"),
        ("end", "COMPLETED"),
    ]
    assert [e.value["step"] for e in everything if e.kind == "published"] == [0, 1, 2]
    assert all(SECRET not in str(e.value) for e in everything)
    assert {e.value["token"] for e in everything if e.kind == "published"} != {SECRET}
    deltas = [e for e in second if e.kind == "delta"]
    text = "".join(e.value["text"] for e in deltas)
    assert len(deltas) >= 3  # while it streamed, not at its end
    assert SECRET not in text  # a secret cut across deltas is masked whole
    assert text == TEXT.replace(SECRET, "***"), text
    assert {e.value["call"] for e in deltas} == {"job-1/3/0"}
    assert all(e.cursor == everything[3].cursor for e in deltas)  # a delta leaves the follower at s2
