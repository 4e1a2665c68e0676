"""SSE heartbeat against a real aiohttp control-plane stub, the heartbeat monitor, and the job heartbeat."""

from __future__ import annotations

import functools
import itertools
import json
import logging
import random
import socket
import statistics
import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentlife import AgentProcess, AttemptFenced, Done, StepContext
from agentlife._observe._heartbeat import SseHeartbeat, format_sse, reconnect_delay
from agentlife._observe._job_heartbeat import JobHeartbeat
from agentlife._observe._status import StatusBoard
from agentlife._runtime import _services
from agentlife._state import State, Transition
from agentlife.stores import SQLiteStore
from agentlife.testing import AgentHarness
from agentlife.testing._control_plane import (
    ControlPlaneStub,
    HeartbeatMonitor,
    HeartbeatStatus,
    ReceivedEvent,
    SseParser,
)

pytestmark = pytest.mark.anyio

TOKEN = "cp-token-Zq8x3Lw91"
INTERVAL = 0.1
HEARTBEAT_KEYS = {
    "type",
    "timestamp",
    "agentId",
    "jobId",
    "podName",
    "lifecycleState",
    "currentStep",
    "metrics",
}
METRIC_KEYS = {"rssMb", "uptimeSeconds", "stepsCompleted", "llmCallsTotal", "toolCallsTotal"}


def counters() -> dict[str, int]:
    return {"stepsCompleted": 7, "llmCallsTotal": 5, "toolCallsTotal": 3}


def make_heartbeat(url: str, *, token: str | None = TOKEN, **kwargs: Any) -> SseHeartbeat:
    options: dict[str, Any] = {
        "agent_id": "reviewer",
        "job_id": "job-1",
        "pod_name": "reviewer-abc12",
        "interval": INTERVAL,
        "snapshot_metrics": counters,
        "reconnect_initial": 0.05,
        "reconnect_max": 0.2,
        "rng": random.Random(7),
    }
    options.update(kwargs)
    return SseHeartbeat(url, token, **options)


def transition(source: State, target: State, reason: str = "") -> Transition:
    return Transition(source, target, reason, time.time())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def plane() -> AsyncIterator[ControlPlaneStub]:
    async with ControlPlaneStub(token=TOKEN, monitor=HeartbeatMonitor(INTERVAL, 3 * INTERVAL)) as stub:
        yield stub


async def run_until(hb: SseHeartbeat, body: Callable[[], Any]) -> Any:
    """Run ``hb`` in a task group while ``body`` runs, then close it; fail if run() raised."""
    result = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(hb.run)
        result = await body()
        await hb.aclose(1.0)
    return result


# -- the stream ---------------------------------------------------------------------------------------


async def test_heartbeats_arrive_every_interval_with_the_design_payload(plane: ControlPlaneStub) -> None:
    board = StatusBoard(job_id="job-1", agent_id="reviewer", attempt=1, pod_name="reviewer-abc12")
    board.update(state=State.EXECUTING, step=3)
    hb = make_heartbeat(plane.url, board=board)

    async def five_beats() -> list[ReceivedEvent]:
        for _ in range(5):
            await plane.wait_for(event="heartbeat", after=len(plane.events), timeout=3.0)
        return plane.events_of("heartbeat")

    beats = await run_until(hb, five_beats)

    first = beats[0].data
    assert set(first) == HEARTBEAT_KEYS
    assert set(first["metrics"]) == METRIC_KEYS
    assert first["type"] == "heartbeat"
    assert (first["agentId"], first["jobId"], first["podName"]) == ("reviewer", "job-1", "reviewer-abc12")
    assert (first["lifecycleState"], first["currentStep"]) == ("EXECUTING", 3)
    assert {k: first["metrics"][k] for k in counters()} == counters()
    assert first["metrics"]["rssMb"] > 1
    assert first["metrics"]["uptimeSeconds"] > 0
    assert first["timestamp"].endswith("Z")
    assert datetime.fromisoformat(first["timestamp"]).utcoffset() is not None
    gaps = [b.received_at - a.received_at for a, b in itertools.pairwise(beats)]
    # The interval is 0.1 s: the median gap is near it, nowhere near zero (a burst) or a full second.
    assert 0.05 < statistics.median(gaps) < 0.5
    assert all(int(b.event_id or 0) > int(a.event_id or 0) for a, b in itertools.pairwise(beats))
    assert board.snapshot().heartbeats["sse"]["ok"] is True
    assert hb.stats.heartbeats_sent >= 5


async def test_a_lifecycle_event_goes_out_at_once_not_with_the_next_heartbeat(
    plane: ControlPlaneStub,
) -> None:
    hb = make_heartbeat(plane.url, interval=30.0)  # the next heartbeat is 30 s away

    async def push_and_wait() -> tuple[ReceivedEvent, float]:
        await plane.wait_for(event="heartbeat", timeout=3.0)
        started = time.monotonic()
        hb.push_lifecycle(
            transition(State.EXECUTING, State.DRAINING, "SIGTERM"),
            {"drainReason": "sigterm", "type": "forged", "dataDir": Path("/data")},  # not JSON: str() it
        )
        event = await plane.wait_for(event="lifecycle", timeout=5.0)
        return event, time.monotonic() - started

    event, latency = await run_until(hb, push_and_wait)
    assert latency < 5.0
    assert event.data["type"] == "lifecycle"  # extra fields cannot replace the standard ones
    assert (event.data["from"], event.data["to"], event.data["lifecycleState"]) == (
        "EXECUTING",
        "DRAINING",
        "DRAINING",
    )
    assert event.data["reason"] == "SIGTERM"
    assert event.data["drainReason"] == "sigterm"
    assert event.data["dataDir"] == "/data"
    assert event.data["agentId"] == "reviewer"


async def test_push_from_another_thread_is_delivered(plane: ControlPlaneStub) -> None:
    hb = make_heartbeat(plane.url, interval=30.0)

    async def push_from_thread() -> ReceivedEvent:
        await plane.wait_for(event="heartbeat", timeout=3.0)
        await anyio.to_thread.run_sync(hb.push_lifecycle, transition(State.READY, State.EXECUTING))
        return await plane.wait_for(event="lifecycle", timeout=5.0)

    event = await run_until(hb, push_from_thread)
    assert event.data["to"] == "EXECUTING"


async def test_reconnects_after_the_control_plane_restarts_on_the_same_port(plane: ControlPlaneStub) -> None:
    board = StatusBoard(job_id="job-1", agent_id="reviewer", attempt=1)
    hb = make_heartbeat(plane.url, board=board)
    port = plane.port

    async def bounce() -> ReceivedEvent:
        first = await plane.wait_for(event="heartbeat", timeout=3.0)
        await plane.stop()
        with anyio.fail_after(5.0):
            while hb.stats.consecutive_failures < 2:
                await anyio.sleep(0.02)
        assert board.snapshot().heartbeats["sse"]["ok"] is False
        hb.push_lifecycle(transition(State.HYDRATING, State.READY, "hydrated while the plane was down"))
        await plane.start()
        assert plane.port == port
        event = await plane.wait_for(event="lifecycle", timeout=5.0)
        assert event.connection_id > first.connection_id
        await plane.wait_for(event="heartbeat", after=plane.events.index(event), timeout=3.0)
        return event

    event = await run_until(hb, bounce)
    assert event.data["to"] == "READY"
    assert board.snapshot().heartbeats["sse"]["ok"] is True
    assert hb.stats.connections >= 3


async def test_a_dead_control_plane_never_slows_the_caller() -> None:
    board = StatusBoard(job_id="job-1", agent_id="reviewer", attempt=1)
    hb = make_heartbeat(f"http://127.0.0.1:{free_port()}", board=board, buffer_size=8)

    async def meanwhile() -> float:
        with anyio.fail_after(5.0):
            while hb.stats.consecutive_failures < 3:
                await anyio.sleep(0.02)
        started = time.perf_counter()
        for _ in range(100):
            hb.push_lifecycle(transition(State.EXECUTING, State.DRAINING))
        elapsed = time.perf_counter() - started
        assert await hb.flush(0.2) is False  # bounded: nothing can get out
        return elapsed

    async with anyio.create_task_group() as tg:
        tg.start_soon(hb.run)
        push_time = await meanwhile()
        tg.cancel_scope.cancel()  # run() kept retrying without raising until now
    assert push_time < 0.5  # 100 pushes never touched the network
    stats = hb.stats
    assert stats.lifecycle_pending == 8
    assert stats.lifecycle_dropped == 92
    assert board.snapshot().heartbeats["sse"]["ok"] is False
    assert board.snapshot().heartbeats["sse"]["failures"] >= 3


async def test_buffered_events_are_sent_newest_kept_after_the_plane_comes_up() -> None:
    port = free_port()
    hb = make_heartbeat(f"http://127.0.0.1:{port}", buffer_size=3, interval=30.0)
    stub = ControlPlaneStub(port=port, token=TOKEN)

    async def late_plane() -> list[ReceivedEvent]:
        for i in range(5):
            hb.push_lifecycle(transition(State.EXECUTING, State.DRAINING, f"event {i}"))
        await anyio.sleep(0.1)
        await stub.start()
        try:
            with anyio.fail_after(5.0):
                while len(stub.events_of("lifecycle")) < 3:
                    await anyio.sleep(0.02)
            await hb.aclose(1.0)
            return stub.events_of("lifecycle")
        finally:
            await stub.stop()

    events = await run_until(hb, late_plane)
    assert [e.data["reason"] for e in events] == ["event 2", "event 3", "event 4"]


async def test_the_token_is_sent_and_never_logged(
    plane: ControlPlaneStub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # httpx and httpcore included
    board = StatusBoard(job_id="job-1", agent_id="reviewer", attempt=1)
    good = make_heartbeat(plane.url, board=board)
    wrong_token = "wrong-token-Hq2v9Ks"
    refused_board = StatusBoard(job_id="job-1", agent_id="reviewer", attempt=1)
    refused = make_heartbeat(plane.url, token=wrong_token, board=refused_board, agent_id="intruder")

    async def both() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(refused.run)
            await plane.wait_for(
                event="heartbeat", agent_id="reviewer", timeout=3.0
            )  # the stub checks the token
            with anyio.fail_after(5.0):
                while refused.stats.consecutive_failures < 2:
                    await anyio.sleep(0.02)
            good.push_lifecycle(transition(State.EXECUTING, State.DRAINING, f"reason with {TOKEN} inside"))
            await plane.wait_for(event="lifecycle", timeout=3.0)
            await refused.aclose(0.5)

    await run_until(good, both)
    assert plane.rejected >= 2
    assert not plane.events_of(agent_id="intruder")
    assert "401" in (refused_board.snapshot().heartbeats["sse"].get("error") or "")
    lifecycle = plane.events_of("lifecycle")[0]
    assert TOKEN not in lifecycle.data["reason"]
    for text in (
        caplog.text,
        json.dumps(board.snapshot().to_json()),
        json.dumps(refused_board.snapshot().to_json()),
        repr(good),
        str(good.stats),
        str(refused.stats),
    ):
        assert TOKEN not in text
        assert wrong_token not in text
    assert "SSE heartbeat stream" in caplog.text  # the failures were logged, just without the secret


async def test_aclose_ends_the_stream_cleanly_after_the_final_events(plane: ControlPlaneStub) -> None:
    hb = make_heartbeat(plane.url, interval=30.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(hb.run)
        await plane.wait_for(event="heartbeat", timeout=3.0)
        hb.push_lifecycle(transition(State.EXECUTING, State.DRAINING, "SIGTERM"))
        hb.push_lifecycle(transition(State.DRAINING, State.TERMINATED, "drained"))
        assert await hb.flush(2.0) is True
        await hb.aclose(2.0)
        # run() returned on its own: the task group exits without being cancelled.
    targets = [e.data["to"] for e in plane.events_of("lifecycle")]
    assert targets == ["DRAINING", "TERMINATED"]
    with anyio.fail_after(2.0):
        while plane.open_streams:
            await anyio.sleep(0.01)
    assert plane.monitor.status("reviewer") is HeartbeatStatus.TERMINATED
    assert hb.stats.consecutive_failures == 0
    await hb.aclose(0.1)  # idempotent


async def test_aclose_is_bounded_when_the_plane_is_dead() -> None:
    hb = make_heartbeat(f"http://127.0.0.1:{free_port()}")
    async with anyio.create_task_group() as tg:
        tg.start_soon(hb.run)
        hb.push_lifecycle(transition(State.DRAINING, State.TERMINATED))
        await anyio.sleep(0.1)
        started = time.monotonic()
        await hb.aclose(0.3)
        assert time.monotonic() - started < 3.0
    assert hb.stats.lifecycle_pending == 1


async def test_the_callers_deadline_bounds_aclose() -> None:
    hb = make_heartbeat(f"http://127.0.0.1:{free_port()}")
    async with anyio.create_task_group() as tg:
        tg.start_soon(hb.run)
        hb.push_lifecycle(transition(State.DRAINING, State.TERMINATED))
        await anyio.sleep(0.05)
        started = time.monotonic()
        with anyio.move_on_after(0.1):
            await hb.aclose(30.0)
        assert time.monotonic() - started < 2.0
    # The task group ended: run() was cancelled even though aclose's own timeout had not passed.
    assert hb.stats.connected is False


async def test_run_twice_is_refused(plane: ControlPlaneStub) -> None:
    hb = make_heartbeat(plane.url)
    await hb.aclose()  # closing before running makes run() return at once
    await hb.run()
    with pytest.raises(RuntimeError):
        await hb.run()


async def test_last_writer_wins_between_two_streams_of_one_agent(plane: ControlPlaneStub) -> None:
    zombie = make_heartbeat(plane.url)
    successor = make_heartbeat(plane.url)
    async with anyio.create_task_group() as tg:
        tg.start_soon(zombie.run)
        first = await plane.wait_for(event="heartbeat", timeout=3.0)
        tg.start_soon(successor.run)
        await plane.wait_for(lambda e: e.connection_id > first.connection_id, timeout=3.0)
        await plane.wait_for(
            lambda e: e.connection_id == first.connection_id, after=len(plane.events), timeout=3.0
        )
        await zombie.aclose(1.0)
        await successor.aclose(1.0)
    state = plane.monitor.agent("reviewer")
    assert state is not None
    assert state.connection_id > first.connection_id
    assert state.ignored >= 1


async def test_the_monitor_sees_a_silent_agent_go_unhealthy(plane: ControlPlaneStub) -> None:
    hb = make_heartbeat(plane.url)
    async with anyio.create_task_group() as tg:
        tg.start_soon(hb.run)
        beat = await plane.wait_for(event="heartbeat", timeout=3.0)
        assert plane.monitor.status("reviewer", now=beat.received_at) is HeartbeatStatus.OK
        tg.cancel_scope.cancel()  # the agent dies without saying goodbye
    await anyio.sleep(4 * INTERVAL)
    assert plane.monitor.status("reviewer") is HeartbeatStatus.UNHEALTHY


# -- pure pieces --------------------------------------------------------------------------------------


def test_reconnect_delay_doubles_to_the_cap_plus_bounded_jitter() -> None:
    rng = random.Random(3)
    bases = [1, 2, 4, 8, 16, 30, 30, 30]
    delays = [reconnect_delay(n, 1.0, 30.0, rng) for n in range(1, 9)]
    for base, delay in zip(bases, delays, strict=True):
        assert base <= delay <= base * 1.2
    assert len({round(d - b, 6) for d, b in zip(delays, bases, strict=True)}) > 1  # jitter varies
    assert reconnect_delay(10_000, 1.0, 30.0, rng) <= 36.0


def test_sse_frames_round_trip_through_the_parser_in_any_chunking() -> None:
    frames = format_sse("heartbeat", {"a": 1, "text": "line\nbreak"}, 1) + format_sse(
        "lifecycle", {"b": 2}, 2
    )
    frames += b": a comment\r\nevent: x\r\ndata: one\r\ndata: two\r\n\r\n"
    for size in (1, 3, 7, len(frames)):
        parser = SseParser()
        events = [e for i in range(0, len(frames), size) for e in parser.feed(frames[i : i + size])]
        assert [(e.event, e.event_id) for e in events] == [
            ("heartbeat", "1"),
            ("lifecycle", "2"),
            ("x", None),
        ]
        assert json.loads(events[0].data) == {"a": 1, "text": "line\nbreak"}
        assert events[2].data == "one\ntwo"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_monitor_ok_warning_unhealthy_in_virtual_time() -> None:
    clock = FakeClock()
    monitor = HeartbeatMonitor(interval=15, unhealthy_after=45, clock=clock)
    assert monitor.status("a") is HeartbeatStatus.UNKNOWN
    monitor.observe("a", 1, "heartbeat", {"lifecycleState": "EXECUTING"})
    expectations = [
        (15.0, HeartbeatStatus.OK),
        (15.01, HeartbeatStatus.WARNING),
        (45.0, HeartbeatStatus.WARNING),
        (45.01, HeartbeatStatus.UNHEALTHY),
    ]
    changes = monitor.poll()
    assert [(c.previous, c.current) for c in changes] == [(HeartbeatStatus.UNKNOWN, HeartbeatStatus.OK)]
    start = clock.now
    for offset, expected in expectations:
        clock.now = start + offset
        assert monitor.status("a") is expected, offset
    assert [c.current for c in monitor.poll()] == [HeartbeatStatus.UNHEALTHY]
    assert monitor.poll() == []
    monitor.observe("a", 1, "heartbeat")
    assert monitor.status("a") is HeartbeatStatus.OK
    assert [(c.previous, c.current) for c in monitor.poll()] == [
        (HeartbeatStatus.UNHEALTHY, HeartbeatStatus.OK)
    ]
    snap = monitor.agent("a")
    assert snap is not None
    assert snap.events == 2
    assert snap.lifecycle_state == "EXECUTING"


def test_monitor_last_writer_wins() -> None:
    clock = FakeClock()
    monitor = HeartbeatMonitor(interval=15, unhealthy_after=45, clock=clock)
    t0 = clock.now
    assert monitor.observe("a", 1, "heartbeat", {"lifecycleState": "EXECUTING"}) is True
    clock.now = t0 + 10
    assert monitor.observe("a", 2, "heartbeat", {"lifecycleState": "HYDRATING"}) is True  # the successor
    clock.now = t0 + 20
    assert monitor.observe("a", 1, "heartbeat", {"lifecycleState": "EXECUTING"}) is False  # the zombie
    clock.now = t0 + 25.5
    snap = monitor.agent("a")
    assert snap is not None
    assert (snap.connection_id, snap.lifecycle_state, snap.ignored) == (2, "HYDRATING", 1)
    assert snap.status is HeartbeatStatus.WARNING  # the zombie's beat at +20 did not keep it OK
    assert monitor.agents().keys() == {"a"}


def test_monitor_a_terminated_agent_is_not_unhealthy() -> None:
    clock = FakeClock()
    monitor = HeartbeatMonitor(interval=15, unhealthy_after=45, clock=clock)
    monitor.observe("a", 1, "lifecycle", {"lifecycleState": "TERMINATED"})
    clock.now += 3600
    assert monitor.status("a") is HeartbeatStatus.TERMINATED


# -- job heartbeat ------------------------------------------------------------------------------------


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "agentlife.db")
    await store.open()
    await store.create_job("job-1", "reviewer", {"x": 1})
    await store.claim("job-1", 1)
    try:
        yield store
    finally:
        await store.close()


async def heartbeat_at(store: SQLiteStore) -> float | None:
    job = await store.get_job("job-1")
    assert job is not None
    return job.heartbeat_at


async def test_job_heartbeat_updates_heartbeat_at_every_interval(store: SQLiteStore) -> None:
    board = StatusBoard(job_id="job-1", agent_id="reviewer", attempt=1)
    beat = JobHeartbeat(store, "job-1", 1, 0.05, board)
    async with anyio.create_task_group() as tg:
        tg.start_soon(beat.run)
        with anyio.fail_after(5.0):
            while beat.beats < 1:
                await anyio.sleep(0.01)
        first = await heartbeat_at(store)
        with anyio.fail_after(5.0):
            while beat.beats < 3:
                await anyio.sleep(0.01)
        second = await heartbeat_at(store)
        tg.cancel_scope.cancel()
    assert first is not None
    assert second is not None
    assert second > first
    assert abs(second - time.time()) < 5
    assert beat.failures == 0
    assert board.snapshot().heartbeats["job"]["ok"] is True


async def test_a_heartbeat_started_after_a_claim_first_beats_one_interval_later(store: SQLiteStore) -> None:
    # The claim has just written heartbeat_at: a beat at once would be a commit saying nothing new.
    board = StatusBoard(job_id="job-1", agent_id="reviewer", attempt=1)
    beat = JobHeartbeat(store, "job-1", 1, 0.5, board)
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(beat.run, beat_now=False))
        await anyio.sleep(0.2)
        assert beat.beats == 0
        assert board.snapshot().heartbeats["job"]["ok"] is True  # the claim's write stands for it
        with anyio.fail_after(5.0):
            while beat.beats < 1:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert beat.failures == 0


async def test_job_heartbeat_counts_failures_and_keeps_going(store: SQLiteStore) -> None:
    board = StatusBoard(job_id="job-1", agent_id="reviewer", attempt=1)
    beat = JobHeartbeat(store, "job-1", 1, 0.03, board)
    async with anyio.create_task_group() as tg:
        tg.start_soon(beat.run)
        with anyio.fail_after(5.0):
            while beat.beats < 1:
                await anyio.sleep(0.01)
        await store.close()
        with anyio.fail_after(5.0):
            while beat.failures < 3:
                await anyio.sleep(0.01)
        await store.open()  # the store comes back: so does the heartbeat
        with anyio.fail_after(5.0):
            while beat.consecutive_failures:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert beat.failures >= 3
    assert beat.fenced is None
    assert board.snapshot().heartbeats["job"]["ok"] is True


async def test_job_heartbeat_failure_is_recorded_on_the_board(store: SQLiteStore) -> None:
    board = StatusBoard(job_id="job-1", agent_id="reviewer", attempt=1)
    beat = JobHeartbeat(store, "job-1", 1, 10.0, board)
    await store.close()
    assert await beat.beat_once() is False
    entry = board.snapshot().heartbeats["job"]
    assert entry["ok"] is False
    assert entry["failures"] == 1
    assert "closed" in entry["error"]


async def test_job_heartbeat_stops_when_a_later_attempt_owns_the_job(
    store: SQLiteStore, caplog: pytest.LogCaptureFixture
) -> None:
    fenced: list[AttemptFenced] = []
    beat = JobHeartbeat(store, "job-1", 1, 0.03, on_fenced=fenced.append)
    await store.claim("job-1", 2)  # the successor claims the row
    before = await heartbeat_at(store)
    with anyio.fail_after(5.0):
        await beat.run()  # returns by itself
    assert isinstance(beat.fenced, AttemptFenced)
    assert fenced == [beat.fenced]
    assert await heartbeat_at(store) == before  # the zombie did not touch the row
    assert "job heartbeat stopped" in caplog.text


async def test_a_thread_pushing_does_not_need_the_loop_to_be_idle(plane: ControlPlaneStub) -> None:
    """push_lifecycle from a thread while the loop is busy returns at once (it only schedules a wake-up)."""
    hb = make_heartbeat(plane.url, interval=30.0)
    durations: list[float] = []

    def pusher() -> None:
        started = time.perf_counter()
        hb.push_lifecycle(transition(State.READY, State.EXECUTING))
        durations.append(time.perf_counter() - started)

    async def busy_loop() -> ReceivedEvent:
        await plane.wait_for(event="heartbeat", timeout=3.0)
        thread = threading.Thread(target=pusher)
        thread.start()
        time.sleep(1.0)  # block the loop on purpose while the thread pushes
        thread.join()
        return await plane.wait_for(event="lifecycle", timeout=3.0)

    event = await run_until(hb, busy_loop)
    assert durations
    assert durations[0] < 0.5  # the loop was blocked for 1 s: the push never waited for it
    assert event.data["to"] == "EXECUTING"


class _Quick(AgentProcess):
    agent_id = "quick"

    async def step(self, ctx: StepContext) -> Done | None:
        return Done(result={"ok": True})


async def test_no_job_heartbeat_reaches_the_store_once_cleanup_closed_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cleanup stops the job heartbeat before it closes the store: a beat after the close would fail, warn.

    The rest of cleanup (the journal, the heartbeat stream) takes its time on a loaded machine: here four
    job heartbeat intervals (20 ms each at the harness's scale) after the store closed, within the budget.
    """

    class SlowCleanup(SQLiteStore):
        async def close(self) -> None:
            await super().close()
            await anyio.sleep(0.08)

    monkeypatch.setattr(_services, "store_from_url", lambda url, **_: SlowCleanup.from_url(url))
    harness = AgentHarness(tmp_path, env={"AGENTLIFE_HEARTBEAT_JOB_INTERVAL_SECONDS": "2"})
    done = await harness.run(_Quick())
    assert done.exit_code == 0
    assert [m for m in done.log_messages() if "job heartbeat" in m] == []
