"""When the OpenTelemetry SDK is built: at READY with an exporter, when first needed without one.

The SDK's imports cost ~45 ms of CPU; built at READY they compete with the first model request. Without an
exporter nothing is sent anywhere, so the build waits for a ``/metrics`` scrape or a full buffer (a step's
end starts nothing: a short job nobody scrapes never pays for the SDK), and what happened before is
replayed: the scrape still shows the whole job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentlife._config import Settings
from agentlife._observe import _telemetry as telemetry_module
from agentlife._observe._probes import ProbeServer
from agentlife._observe._status import StatusBoard
from agentlife._observe._telemetry_export import exporters_configured
from agentlife._observe._telemetry_facade import BUILD_AFTER_RECORDS, TelemetryFacade
from agentlife._state import State, Transition


def _sample(text: str, family: str, suffix: str = "", **labels: str) -> float:
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            for s in fam.samples:
                if s.name == family + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
                    return float(s.value)
    raise AssertionError(f"{family}{suffix} {labels} not in /metrics")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings.from_env({"AGENTLIFE_DATA_DIR": str(tmp_path)}, job_id="deferred-1", agent_id="deferred")


@pytest.fixture
def board() -> StatusBoard:
    return StatusBoard(job_id="deferred-1", agent_id="deferred", attempt=1)


def _ready(facade: TelemetryFacade) -> None:
    for source, target in ((State.BOOTING, State.HYDRATING), (State.HYDRATING, State.READY)):
        facade.record_transition(Transition(source, target, "test", time.time()))


def _built(facade: TelemetryFacade) -> None:
    thread = facade._thread
    assert thread is not None
    thread.join(30)
    assert facade.telemetry is not None


@pytest.mark.parametrize(
    ("env", "configured"),
    [
        ({}, False),
        ({"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_METRICS_EXPORTER": "prometheus"}, False),  # served by /metrics: nothing to send
        ({"OTEL_METRICS_EXPORTER": " , "}, False),
        ({"OTEL_METRICS_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_METRICS_EXPORTER": "prometheus,console"}, True),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, True),  # unsupported: built at READY so its warning is early
    ],
)
def test_only_an_exporter_that_sends_data_counts_as_configured(env: dict[str, str], configured: bool) -> None:
    assert exporters_configured(env) is configured


def test_with_an_exporter_the_sdk_is_built_at_ready(settings: Settings, board: StatusBoard) -> None:
    facade = TelemetryFacade()
    facade.start_building(settings, board, {"OTEL_TRACES_EXPORTER": "console"})
    _built(facade)  # no step, no scrape: started by start_building itself
    assert board.metrics_text is not None and facade.telemetry is not None
    facade.telemetry.shutdown(5.0)


def test_without_an_exporter_only_the_scrape_builds_it_and_nothing_is_lost(
    settings: Settings, board: StatusBoard
) -> None:
    facade = TelemetryFacade()
    facade.hydration_phase("checkpoint", 0.01)
    _ready(facade)
    facade.start_building(settings, board, {})
    facade.llm_call("m", "ok", None)
    facade.step_completed(0.2)
    assert facade._thread is None and facade.telemetry is None  # nothing started by READY, a call or a step
    assert board.metrics_ready is not None
    board.metrics_ready()  # what a /metrics scrape does first
    _built(facade)
    assert facade.telemetry is not None
    assert board.metrics_text == facade.telemetry.prometheus_text  # the facade steps out of the scrape
    text = facade.telemetry.prometheus_text()
    assert _sample(text, "agent_steps_completed", "_total") == 1
    assert _sample(text, "agent_llm_calls", "_total", model="m", outcome="ok") == 1
    assert _sample(text, "agent_hydration_duration_seconds", "_count", phase="checkpoint") == 1
    assert _sample(text, "agent_lifecycle_state", state="READY") == 1
    facade.telemetry.shutdown(5.0)


@pytest.fixture
def probes(board: StatusBoard) -> Iterator[int]:
    server = ProbeServer(board, "127.0.0.1", 0, blocked_threshold=30.0)
    server.start()
    port = server.wait_started(timeout=30)
    assert port is not None
    yield port
    server.stop()


def _get(port: int, path: str) -> tuple[int, str]:
    answer = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=30.0)
    return answer.status_code, answer.text


def test_a_scrape_before_any_step_builds_it_and_answers_with_what_was_buffered(
    settings: Settings, board: StatusBoard, probes: int
) -> None:
    facade = TelemetryFacade()
    _ready(facade)
    facade.start_building(settings, board, {})
    assert facade.telemetry is None
    answers: list[tuple[int, str]] = []
    scrapers = [threading.Thread(target=lambda: answers.append(_get(probes, "/metrics"))) for _ in range(3)]
    for scraper in scrapers:  # three scrapes at once: one build, each waits for it
        scraper.start()
    for scraper in scrapers:
        scraper.join(60)
    assert [status for status, _ in answers] == [200, 200, 200]
    assert {_sample(text, "agent_lifecycle_state", state="READY") for _, text in answers} == {1}
    assert all("target_info" in text for _, text in answers)  # the SDK's rendering, not the core gauges
    assert facade.telemetry is not None and board.metrics_ready is None
    facade.telemetry.shutdown(5.0)


def test_a_scrape_waiting_for_the_build_does_not_hold_up_the_liveness_probe(
    settings: Settings, board: StatusBoard, probes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real = telemetry_module.Telemetry

    def held(*args: Any, **kwargs: Any) -> Any:
        assert release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(telemetry_module, "Telemetry", held)
    facade = TelemetryFacade()
    _ready(facade)
    board.update(state=State.READY)
    facade.start_building(settings, board, {})
    scraped: list[tuple[int, str]] = []
    scraper = threading.Thread(target=lambda: scraped.append(_get(probes, "/metrics")))
    scraper.start()
    while facade._thread is None:  # the scrape has started the build, which is held
        time.sleep(0.01)
    assert _get(probes, "/healthz")[0] == 200  # answered while the build (and the scrape) still wait
    assert _get(probes, "/readyz")[0] == 200
    assert scraped == []
    release.set()
    scraper.join(60)
    assert scraped[0][0] == 200 and _sample(scraped[0][1], "agent_lifecycle_state", state="READY") == 1
    assert facade.telemetry is not None
    facade.telemetry.shutdown(5.0)


def test_a_long_first_step_builds_it_once_the_buffer_is_full(settings: Settings, board: StatusBoard) -> None:
    facade = TelemetryFacade()
    facade.start_building(settings, board, {})
    for i in range(BUILD_AFTER_RECORDS - 1):
        facade.tool_call("t", "ok", 0.001 * (i % 5))
    assert facade._thread is None
    facade.tool_call("t", "ok", 0.0)
    _built(facade)
    assert facade.telemetry is not None
    text = facade.telemetry.prometheus_text()
    assert _sample(text, "agent_tool_calls", "_total", tool="t", outcome="ok") == BUILD_AFTER_RECORDS
    facade.telemetry.shutdown(5.0)


def test_a_failed_build_drops_the_buffer_and_the_scrape_serves_the_core_gauges(
    settings: Settings, board: StatusBoard, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no SDK here")

    monkeypatch.setattr(telemetry_module, "Telemetry", broken)
    facade = TelemetryFacade()
    facade.start_building(settings, board, {})
    render, ready = board.metrics_text, board.metrics_ready
    assert render is not None and ready is not None
    ready()
    assert render() is None  # the probe serves its core gauges instead
    facade.step_completed(0.1)
    assert facade.telemetry is None and facade._pending == []


def test_a_transition_recorded_while_the_buffer_is_replayed_is_not_overwritten_by_an_older_one(
    settings: Settings, board: StatusBoard
) -> None:
    # The deferred build often lands at the end of a short job, scraped while it drains: the replay of READY
    # and EXECUTING must not come after DRAINING and leave the gauge in the past.
    facade = TelemetryFacade()
    replaying = threading.Event()
    facade.record_transition(Transition(State.BOOTING, State.HYDRATING, "test", time.time()))
    facade._record(lambda t: (replaying.set(), time.sleep(0.3)))
    facade.record_transition(Transition(State.HYDRATING, State.READY, "test", time.time()))
    facade.record_transition(Transition(State.READY, State.EXECUTING, "test", time.time()))
    facade.start_building(settings, board, {})
    assert board.metrics_text is not None
    assert board.metrics_text() is None  # a /metrics scrape before the build: it starts it
    assert replaying.wait(30)
    facade.record_transition(Transition(State.EXECUTING, State.DRAINING, "test", time.time()))
    _built(facade)
    assert facade.telemetry is not None
    text = facade.telemetry.prometheus_text()
    assert _sample(text, "agent_lifecycle_state", state="DRAINING") == 1
    assert _sample(text, "agent_lifecycle_state", state="EXECUTING") == 0
    facade.telemetry.shutdown(5.0)
