"""Telemetry: Prometheus text, GenAI spans, OTLP export to a real local receiver, the bootstrap tax."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client.parser import text_string_to_metric_families

from agentlife._llm._protocol import LLMReply, Usage
from agentlife._observe._prometheus import prometheus_name
from agentlife._observe._status import StatusBoard
from agentlife._observe._telemetry import (
    INSTRUMENTS,
    Telemetry,
    bootstrap_kind,
    process_start_time,
)
from agentlife._state import State, Transition

# The instruments of an agent process, by the Prometheus family name and type they must show up as.
EXPECTED_FAMILIES = {
    "agent_lifecycle_state": "gauge",
    "agent_steps_completed": "counter",
    "agent_llm_calls": "counter",
    "agent_tool_calls": "counter",
    "agent_drains": "counter",
    "agent_event_loop_lag_seconds": "gauge",
    "agent_hydration_duration_seconds": "histogram",
    "agent_step_duration_seconds": "histogram",
    "agent_drain_duration_seconds": "histogram",
    "agent_bootstrap_seconds": "histogram",
    "agent_execution_seconds": "histogram",
}
LINUX = Path("/proc/self/stat").exists()


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(text: str, name: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    ]


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    t = Telemetry("reviewer", {"agent.id": "reviewer", "job.id": "job-1"}, env={})
    yield t
    t.shutdown(2.0)


@pytest.fixture
def traced() -> Iterator[tuple[Telemetry, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    t = Telemetry("reviewer", {}, env={}, span_processors=[SimpleSpanProcessor(exporter)])
    yield t, exporter
    t.shutdown(2.0)


# -- /metrics ---------------------------------------------------------------------------------------


def test_a_fresh_process_exposes_every_instrument(telemetry: Telemetry) -> None:
    found = families(telemetry.prometheus_text())
    for name, kind in EXPECTED_FAMILIES.items():
        assert name in found, name
        assert found[name].type == kind, name
    for spec in INSTRUMENTS:
        assert prometheus_name(spec.name, spec.unit, spec.kind) in found
    state = {s.labels["state"]: s.value for s in found["agent_lifecycle_state"].samples}
    assert state == {s.value: (1.0 if s is State.BOOTING else 0.0) for s in State}
    assert [s.value for s in found["agent_steps_completed"].samples] == [0.0]


def test_with_nothing_to_export_no_span_or_exemplar_is_made_and_every_count_still_is(
    telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spans and exemplars reach only an exporter: without one they are not made (most of a call's cost)."""
    with telemetry.tool_span("read_file", "job-1/0/0") as span, telemetry.step_span(0) as outer:
        assert not span.is_recording() and not outer.is_recording()
        telemetry.tool_call("read_file", "ok", 0.01)
    assert ("agent_tool_calls_total", {"outcome": "ok", "tool": "read_file"}, 1.0) in samples(
        telemetry.prometheus_text(), "agent_tool_calls_total"
    )
    data = telemetry._reader.get_metrics_data()
    points = [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        for p in m.data.data_points
    ]
    assert points and not any(getattr(p, "exemplars", None) for p in points)

    # Asked for by name, exemplars are offered all the same.
    asked = Telemetry("reviewer", {}, env={"OTEL_METRICS_EXEMPLAR_FILTER": "always_on"})
    try:
        asked.tool_call("read_file", "ok", 0.01)
        data = asked._reader.get_metrics_data()
        assert any(
            getattr(p, "exemplars", None)
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            for p in m.data.data_points
        )
    finally:
        asked.shutdown(2.0)


def test_a_span_processor_makes_spans_record(traced: tuple[Telemetry, InMemorySpanExporter]) -> None:
    t, exporter = traced
    with t.tool_span("read_file", "job-1/0/0") as span:
        assert span.is_recording()
    assert [s.name for s in exporter.get_finished_spans()] == ["execute_tool read_file"]


def test_recorded_values_come_out_in_prometheus_text(telemetry: Telemetry) -> None:
    telemetry.record_transition(Transition(State.READY, State.EXECUTING, "", time.time()))
    telemetry.step_completed(0.3)
    telemetry.step_completed(1.7)
    telemetry.llm_call("claude-sonnet-4-5", "ok", Usage(input_tokens=120, output_tokens=30))
    telemetry.llm_call("claude-sonnet-4-5", "timeout")
    telemetry.tool_call("read_file", "ok", 0.02)
    telemetry.drain("sigterm", 0.4)
    telemetry.loop_lag(0.0125)
    for phase, seconds in (("claim", 0.004), ("checkpoint", 0.01), ("journal_scan", 0.002), ("memory", 0.3)):
        telemetry.hydration_phase(phase, seconds)
    telemetry.bootstrap("cold")
    telemetry.execution(42.0)
    text = telemetry.prometheus_text()
    found = families(text)
    assert set(EXPECTED_FAMILIES) <= set(found)

    state = {s.labels["state"]: s.value for s in found["agent_lifecycle_state"].samples}
    assert state["EXECUTING"] == 1.0
    assert sum(state.values()) == 1.0
    assert samples(text, "agent_steps_completed_total") == [("agent_steps_completed_total", {}, 2.0)]
    calls = {(s[1]["model"], s[1]["outcome"]): s[2] for s in samples(text, "agent_llm_calls_total")}
    assert calls == {("claude-sonnet-4-5", "ok"): 1.0, ("claude-sonnet-4-5", "timeout"): 1.0}
    tokens = {s[1]["type"]: s[2] for s in samples(text, "agent_llm_tokens_total")}
    assert tokens == {"input": 120.0, "output": 30.0}
    assert samples(text, "agent_tool_calls_total") == [
        ("agent_tool_calls_total", {"tool": "read_file", "outcome": "ok"}, 1.0)
    ]
    assert samples(text, "agent_drains_total") == [("agent_drains_total", {"reason": "sigterm"}, 1.0)]
    assert samples(text, "agent_event_loop_lag_seconds")[0][2] == pytest.approx(0.0125)
    phases = {s[1]["phase"] for s in samples(text, "agent_hydration_duration_seconds_count")}
    assert phases == {"claim", "checkpoint", "journal_scan", "memory"}
    assert samples(text, "agent_bootstrap_seconds_count")[0][1] == {"start": "cold"}
    assert samples(text, "agent_execution_seconds_sum")[0][2] == pytest.approx(42.0)

    buckets = samples(text, "agent_step_duration_seconds_bucket")
    counts = [value for _, _, value in buckets]
    assert counts == sorted(counts)  # cumulative
    assert buckets[-1][1]["le"] == "+Inf"
    assert counts[-1] == 2.0
    by_le = {labels["le"]: value for _, labels, value in buckets}
    assert by_le["0.5"] == 1.0
    assert by_le["2.5"] == 2.0
    assert samples(text, "agent_step_duration_seconds_sum")[0][2] == pytest.approx(2.0)
    assert samples(text, "agent_step_duration_seconds_count")[0][2] == 2.0


def test_target_info_carries_the_resource_with_env_precedence() -> None:
    env = {
        "OTEL_SERVICE_NAME": "from-env",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=staging,agent.id=overridden,team=a%20b",
    }
    t = Telemetry("from-code", {"agent.id": "reviewer"}, env=env)
    try:
        info = samples(t.prometheus_text(), "target_info")[0][1]
    finally:
        t.shutdown(1.0)
    assert info["service_name"] == "from-env"
    assert info["agent_id"] == "reviewer"  # the caller's attributes win over OTEL_RESOURCE_ATTRIBUTES
    assert info["deployment_environment"] == "staging"
    assert info["team"] == "a b"


def test_prometheus_text_is_safe_from_other_threads(telemetry: Telemetry) -> None:
    errors: list[BaseException] = []
    stop = threading.Event()

    def scrape() -> None:
        try:
            while not stop.is_set():
                families(telemetry.prometheus_text())
        except BaseException as exc:
            errors.append(exc)

    scrapers = [threading.Thread(target=scrape) for _ in range(3)]
    for thread in scrapers:
        thread.start()
    for i in range(2000):
        telemetry.tool_call(f"tool{i % 5}", "ok", 0.001)
        telemetry.step_completed(0.01)
    stop.set()
    for thread in scrapers:
        thread.join()
    assert errors == []
    assert samples(telemetry.prometheus_text(), "agent_steps_completed_total")[0][2] == 2000.0


def test_loop_lag_follows_the_status_board_at_scrape_time(telemetry: Telemetry) -> None:
    board = StatusBoard(job_id="job-1", agent_id="reviewer", attempt=1)
    telemetry.follow_board(board)
    board.tick(0.25)
    assert samples(telemetry.prometheus_text(), "agent_event_loop_lag_seconds")[0][2] == pytest.approx(0.25)
    board.tick(0.003)
    assert samples(telemetry.prometheus_text(), "agent_event_loop_lag_seconds")[0][2] == pytest.approx(0.003)


def test_unknown_hydration_phase_is_refused(telemetry: Telemetry) -> None:
    with pytest.raises(ValueError, match="journal_scan"):
        telemetry.hydration_phase("warmup", 1.0)


def test_shutdown_is_idempotent_and_metrics_stay_readable(telemetry: Telemetry) -> None:
    telemetry.step_completed(0.1)
    assert telemetry.shutdown(2.0) is True
    assert telemetry.shutdown(2.0) is True
    assert samples(telemetry.prometheus_text(), "agent_steps_completed_total")[0][2] == 1.0


def test_prometheus_names_follow_the_otel_conventions() -> None:
    assert prometheus_name("agent.step.duration", "s", "histogram") == "agent_step_duration_seconds"
    assert prometheus_name("agent.bootstrap_seconds", "s", "histogram") == "agent_bootstrap_seconds"
    assert prometheus_name("agent.llm.calls", "{call}", "counter") == "agent_llm_calls"
    assert prometheus_name("agent.rss", "By", "gauge") == "agent_rss_bytes"
    assert prometheus_name("agent.requests_total", "{request}", "counter") == "agent_requests"


# -- spans ------------------------------------------------------------------------------------------


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {span.name: span for span in exporter.get_finished_spans()}


def test_llm_and_tool_spans_carry_genai_attributes_inside_the_step_span(
    traced: tuple[Telemetry, InMemorySpanExporter],
) -> None:
    t, exporter = traced
    with t.step_span(4):
        with t.llm_span("claude-sonnet-4-5", max_tokens=1024) as llm:
            llm.record_response(Usage(input_tokens=900, output_tokens=77), "end_turn", response_id="msg_1")
        with t.tool_span("read_file", "job-1/4/1"):
            pass
    spans = by_name(exporter)
    step, chat, tool = spans["agent.step"], spans["chat claude-sonnet-4-5"], spans["execute_tool read_file"]
    assert step.attributes is not None
    assert step.attributes["agent.step"] == 4
    assert (
        dict(chat.attributes or {}).items()
        >= {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": "anthropic",
            "gen_ai.request.model": "claude-sonnet-4-5",
            "gen_ai.request.max_tokens": 1024,
            "gen_ai.usage.input_tokens": 900,
            "gen_ai.usage.output_tokens": 77,
            "gen_ai.response.id": "msg_1",
        }.items()
    )
    assert tuple((chat.attributes or {})["gen_ai.response.finish_reasons"]) == ("end_turn",)  # type: ignore[arg-type]
    assert (
        dict(tool.attributes or {}).items()
        >= {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "read_file",
            "gen_ai.tool.call.id": "job-1/4/1",
        }.items()
    )
    assert chat.kind.name == "CLIENT"
    for child in (chat, tool):
        assert child.parent is not None
        assert child.parent.span_id == step.context.span_id  # type: ignore[union-attr]


def test_llm_span_records_an_agentlife_reply_and_an_error(
    traced: tuple[Telemetry, InMemorySpanExporter],
) -> None:
    t, exporter = traced
    reply = LLMReply(
        text="hi", usage=Usage(input_tokens=5, output_tokens=2), stop_reason="max_tokens", model="m-1"
    )
    with t.llm_span("m-1", max_tokens=8) as llm:
        llm.record_reply(reply)

    def failing_call() -> None:
        with t.llm_span("m-2") as llm:
            exc = TimeoutError("stream stalled")
            llm.record_error(exc)
            raise exc

    with pytest.raises(TimeoutError):
        failing_call()
    spans = by_name(exporter)
    ok, failed = spans["chat m-1"], spans["chat m-2"]
    assert (
        dict(ok.attributes or {}).items()
        >= {
            "gen_ai.usage.input_tokens": 5,
            "gen_ai.usage.output_tokens": 2,
            "gen_ai.response.model": "m-1",
        }.items()
    )
    assert tuple((ok.attributes or {})["gen_ai.response.finish_reasons"]) == ("max_tokens",)  # type: ignore[arg-type]
    assert ok.status.status_code is StatusCode.UNSET
    assert (failed.attributes or {})["error.type"] == "TimeoutError"
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]


def test_a_failing_call_marks_its_span(traced: tuple[Telemetry, InMemorySpanExporter]) -> None:
    t, exporter = traced
    with pytest.raises(RuntimeError), t.tool_span("kubectl_apply", "job-1/0/0"):
        raise RuntimeError("boom")
    span = by_name(exporter)["execute_tool kubectl_apply"]
    assert span.status.status_code is StatusCode.ERROR
    assert any(event.name == "exception" for event in span.events)


@pytest.mark.anyio
async def test_a_cancelled_call_says_so(traced: tuple[Telemetry, InMemorySpanExporter]) -> None:
    t, exporter = traced
    with anyio.move_on_after(0.01), t.llm_span("claude-haiku-4-5"):
        await anyio.sleep(5)
    span = by_name(exporter)["chat claude-haiku-4-5"]
    assert (span.attributes or {})["agentlife.cancelled"] is True


# -- exporters from OTEL_* --------------------------------------------------------------------------


class OtlpReceiver:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.url = ""

    async def handle(self, request: Any) -> Any:
        from aiohttp import web

        self.requests.append((request.path, dict(request.headers), await request.read()))
        return web.Response(status=200, content_type="application/x-protobuf", body=b"")


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    from aiohttp import web

    rx = OtlpReceiver()
    app = web.Application()
    app.router.add_post("/v1/metrics", rx.handle)
    app.router.add_post("/v1/traces", rx.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    rx.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield rx
    finally:
        await runner.cleanup()


@pytest.mark.anyio
async def test_otlp_exporters_send_metrics_and_spans_to_the_configured_endpoint(
    receiver: OtlpReceiver,
) -> None:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    env = {
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_EXPORTER_OTLP_HEADERS": "x-collector-key=k3y%20value",
        "OTEL_SERVICE_NAME": "reviewer-svc",
    }
    t = await anyio.to_thread.run_sync(lambda: Telemetry("reviewer", {"job.id": "job-9"}, env=env))
    t.step_completed(0.2)
    with t.step_span(0):
        pass
    # shutdown blocks (it flushes over HTTP), and the receiver lives on this loop: run it on a thread.
    assert await t.ashutdown(10.0) is True

    paths = {path for path, _, _ in receiver.requests}
    assert paths == {"/v1/metrics", "/v1/traces"}
    metrics_body = next(body for path, _, body in receiver.requests if path == "/v1/metrics")
    metrics = ExportMetricsServiceRequest.FromString(metrics_body)
    names = {m.name for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {"agent.steps.completed", "agent.step.duration", "agent.lifecycle.state"} <= names
    resource = {a.key: a.value.string_value for a in metrics.resource_metrics[0].resource.attributes}
    assert resource["service.name"] == "reviewer-svc"
    assert resource["job.id"] == "job-9"
    traces_body = next(body for path, _, body in receiver.requests if path == "/v1/traces")
    traces = ExportTraceServiceRequest.FromString(traces_body)
    span_names = {s.name for rs in traces.resource_spans for ss in rs.scope_spans for s in ss.spans}
    assert span_names == {"agent.step"}
    assert all(headers.get("x-collector-key") == "k3y value" for _, headers, _ in receiver.requests)


def test_shutdown_is_bounded_when_the_collector_is_down() -> None:
    env = {
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",  # discard port: nothing listens
        "OTEL_EXPORTER_OTLP_TIMEOUT": "0.5",
    }
    before = set(threading.enumerate())
    t = Telemetry("reviewer", {}, env=env)
    with t.step_span(0):
        pass
    started = time.monotonic()
    t.shutdown(0.5)
    assert time.monotonic() - started < 2.0
    deadline = time.monotonic() + 10.0  # the exporters' own threads end on their 0.5 s export timeout
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(threading.enumerate()) - before == set()


def test_console_exporter_writes_to_stderr_not_to_the_json_log_stream(
    capfd: pytest.CaptureFixture[str],
) -> None:
    t = Telemetry("reviewer", {}, env={"OTEL_TRACES_EXPORTER": "console"})
    with t.tool_span("file_read", "job-1/0/0"):
        pass
    t.shutdown(2.0)
    out, err = capfd.readouterr()
    assert "execute_tool file_read" in err
    assert "execute_tool file_read" not in out


def test_unknown_exporters_are_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "agentlife.telemetry")
    t = Telemetry("reviewer", {}, env={"OTEL_METRICS_EXPORTER": "zipkin", "OTEL_TRACES_EXPORTER": "jaeger"})
    t.step_completed(0.1)
    t.shutdown(1.0)
    assert "OTEL_METRICS_EXPORTER=zipkin" in caplog.text
    assert "OTEL_TRACES_EXPORTER=jaeger" in caplog.text


# -- the bootstrap tax ------------------------------------------------------------------------------


@pytest.mark.skipif(not LINUX, reason="needs /proc")
def test_process_start_time_is_in_the_past_and_stable() -> None:
    first = process_start_time()
    time.sleep(0.02)
    second = process_start_time()
    assert first < time.time()
    assert abs(first - second) < 0.02  # tick resolution, not drifting with the clock
    assert time.time() - first > 0.05  # this process has run pytest for a while


def test_bootstrap_kind_follows_earlier_sessions_in_the_data_dir(tmp_path: Path) -> None:
    never = 1e9  # disable the "not the container's first process" rule for this test
    sessions = tmp_path / "sessions" / "job-1"
    sessions.mkdir(parents=True)
    assert bootstrap_kind(data_dir=tmp_path, job_id="job-1", margin=never) == "cold"
    started_ms = int(process_start_time() * 1000)
    (sessions / f"session_0002_{started_ms + 60_000}.jsonl").write_text("")  # this process's own file
    assert bootstrap_kind(data_dir=tmp_path, job_id="job-1", margin=never) == "cold"
    (sessions / f"session_0001_{started_ms - 60_000}.jsonl").write_text("")  # an earlier attempt's
    assert bootstrap_kind(data_dir=tmp_path, job_id="job-1", margin=never) == "warm"
    assert bootstrap_kind(data_dir=tmp_path, job_id="other", margin=never) == "cold"


@pytest.mark.skipif(not LINUX, reason="needs /proc")
def test_bootstrap_kind_is_cold_for_the_first_process_of_a_pid_namespace() -> None:
    # pytest is not PID 1 and started well after it: a re-run in a live machine is warm.
    init_start = Path("/proc/1/stat").read_bytes()
    assert init_start
    if os.getpid() == 1:
        pytest.skip("running as PID 1")
    assert bootstrap_kind(margin=0.0) == "warm"
    assert bootstrap_kind(margin=1e9) == "cold"


# -- the job of each span and measurement ------------------------------------------------------------


def test_spans_and_measurements_name_the_job_of_their_task_without_a_series_per_job() -> None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from agentlife._logging import job_attributes

    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    t = Telemetry(
        "pool",
        {"agent.id": "a"},
        env={},
        span_processors=[SimpleSpanProcessor(exporter)],
        metric_readers=[reader],
    )
    for job_id, attempt, seconds in (("j-1", 1, 0.1), ("j-2", 3, 2.0)):
        with job_attributes(job_id, attempt), t.step_span(0):
            t.tool_call("read_file", "ok", 0.01)
            t.step_completed(seconds)
    with t.step_span(0):  # outside a job: no job attributes, nothing stale from the last one
        pass
    spans = exporter.get_finished_spans()
    assert [(s.attributes or {}).get("job.id") for s in spans] == ["j-1", "j-2", None]
    assert [(s.attributes or {}).get("job.attempt") for s in spans] == [1, 3, None]
    # /metrics keeps one series per instrument's own attributes: a worker's thousand jobs are not a
    # thousand series.
    text = t.prometheus_text()
    assert "j-1" not in text and "job_id" not in text
    assert "agent_steps_completed_total 2" in text
    assert 'agent_tool_calls_total{outcome="ok",tool="read_file"} 2' in text
    # The job rides on the exemplars of each point (what an OTLP export carries).
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        m.name: list(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    (tool_point,) = points["agent.tool.calls"]
    assert dict(tool_point.attributes or {}) == {"tool": "read_file", "outcome": "ok"}
    # A histogram keeps an exemplar per bucket: the two steps landed in different ones.
    (step_point,) = points["agent.step.duration"]
    exemplars = {
        (e.value, tuple(sorted((e.filtered_attributes or {}).items()))) for e in step_point.exemplars
    }
    assert exemplars == {
        (0.1, (("job.attempt", 1), ("job.id", "j-1"))),
        (2.0, (("job.attempt", 3), ("job.id", "j-2"))),
    }
    t.shutdown(2.0)
