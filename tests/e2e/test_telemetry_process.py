"""Telemetry: Prometheus text, GenAI spans, OTLP export to a real local receiver, the bootstrap tax."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentlife.stores import JobStatus

LINUX = Path("/proc/self/stat").exists()


def samples(text: str, name: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    ]


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


# -- the bootstrap tax ------------------------------------------------------------------------------

CHILD = """
import json, time
from agentlife._observe._telemetry import Telemetry
t = Telemetry("child", {}, env={})
time.sleep(0.2)
called = time.time()
value = t.bootstrap("cold")
again = t.bootstrap("warm")
print(json.dumps({"value": value, "again": again, "called": called, "text": t.prometheus_text()}))
"""


@pytest.mark.skipif(not LINUX, reason="needs /proc")
def test_bootstrap_seconds_count_from_the_kernel_process_start() -> None:
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    spawned = time.time()  # the child process exists by now
    out, _ = child.communicate(timeout=60)
    report = json.loads(out)
    # Independent bounds: the child started between `before` and `spawned`, as the parent saw.
    assert report["value"] >= report["called"] - spawned - 0.002
    assert report["value"] <= report["called"] - before + 0.05
    assert report["value"] > 0.2  # interpreter start, imports and the sleep all count
    assert report["again"] == report["value"]  # recorded once, at the first tool dispatch
    count = samples(report["text"], "agent_bootstrap_seconds_count")
    assert count == [("agent_bootstrap_seconds_count", {"start": "cold"}, 1.0)]


# -- the job of each span and measurement ------------------------------------------------------------


@pytest.mark.anyio
async def test_a_workers_spans_and_metrics_name_each_job_not_the_worker(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from test_worker import create_jobs, finish, free_port, http, poll, rows, spawn_worker, worker_env

    url, port = f"sqlite:///{tmp_path / 'agentlife.db'}", free_port()
    await anyio.to_thread.run_sync(create_jobs, url)
    env = worker_env(
        tmp_path,
        url,
        port,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
    )
    worker = spawn_worker(env)
    try:
        # Telemetry is built once the worker is READY; the jobs come after it, so every span is exported.
        await anyio.to_thread.run_sync(
            lambda: poll(lambda: "agent_steps_completed_total" in http(port, "/metrics")[1])
        )
        await anyio.to_thread.run_sync(lambda: create_jobs(url, "j-1", "j-2"))
        await anyio.to_thread.run_sync(
            lambda: poll(lambda: {r.status for r in rows(url).values()} == {JobStatus.COMPLETED})
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        code, out = await anyio.to_thread.run_sync(finish, worker)
    assert code == 143, out

    def attributes(items: Any) -> dict[str, Any]:
        return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in items}

    traces = [ExportTraceServiceRequest.FromString(b) for p, _, b in receiver.requests if p == "/v1/traces"]
    steps = [
        (attributes(rs.resource.attributes), attributes(span.attributes))
        for request in traces
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
        if span.name == "agent.step"
    ]
    assert sorted((s["job.id"], s["job.attempt"], s["agent.step"]) for _, s in steps) == [
        ("j-1", 1, 0),
        ("j-1", 1, 1),
        ("j-2", 1, 0),
        ("j-2", 1, 1),
    ]
    # The resource is the worker's: it names no job (it used to say job.id="worker").
    assert all("job.id" not in resource for resource, _ in steps)
    metrics = [
        ExportMetricsServiceRequest.FromString(b) for p, _, b in receiver.requests if p == "/v1/metrics"
    ]
    step_points = [
        point
        for request in metrics
        for rm in request.resource_metrics
        if "job.id" not in attributes(rm.resource.attributes)
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "agent.step.duration"
        for point in m.histogram.data_points
    ]
    assert step_points and all("job.id" not in attributes(p.attributes) for p in step_points)
    jobs = {attributes(e.filtered_attributes).get("job.id") for p in step_points for e in p.exemplars}
    assert jobs and jobs <= {"j-1", "j-2"}
