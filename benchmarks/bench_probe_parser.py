"""Whether h11 should parse the probe server's requests: its boot cost and its per-request cost.

h11 is the sans-I/O HTTP/1.1 parser of httpcore and uvicorn. The probe server parses requests by hand
(``agentlife._observe._probe_http``) because its imports sit on the probe thread while boot runs. Measured
in the same run, against the hand-written parser:

* the import: ``import h11`` after the probe server's own modules (what switching would add at boot);
* parsing one kubelet request (``GET /readyz`` with its usual headers), end to end from bytes.

The switch is worth it only if h11 adds at most 10 ms at boot and parses no slower.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from _common import child_env, emit, median

RUNS = 15
PARSES = 20_000
REQUEST = (
    b"GET /readyz HTTP/1.1\r\nHost: 10.0.0.7:8086\r\nUser-Agent: kube-probe/1.31\r\n"
    b"Accept: */*\r\nConnection: close\r\n\r\n"
)
PROBE_MODULES = "import agentlife._observe._probes, agentlife._runtime._lifecycle"


def _process_seconds(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=child_env())
    return time.perf_counter() - started


def bench_import() -> None:
    with_h11, without = [], []
    for _ in range(RUNS):
        without.append(_process_seconds(PROBE_MODULES))
        with_h11.append(_process_seconds(f"{PROBE_MODULES}; import h11"))
    extra_ms = (median(with_h11) - median(without)) * 1000
    emit(
        "probe_parser",
        "import h11 after the probe server's modules (median of process wall time)",
        median(with_h11) * 1000,
        "ms",
        baseline=median(without) * 1000,
        target="informs the choice: h11 would have to add <= 10 ms at boot",
        ok=True,  # a decision input, not a regression gate: the hand-written parser stays otherwise
        extra_ms=round(extra_ms, 1),
        h11_qualifies=extra_ms <= 10,
    )


async def _parse_hand_written() -> float:
    from agentlife._observe._probe_http import read_request

    started = time.perf_counter()
    for _ in range(PARSES):
        reader = asyncio.StreamReader(limit=8192)
        reader.feed_data(REQUEST)
        request = await read_request(reader)
        assert request.path == "/readyz"
    return (time.perf_counter() - started) / PARSES


def _parse_h11() -> float:
    import h11

    started = time.perf_counter()
    for _ in range(PARSES):
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=16384)
        conn.receive_data(REQUEST)
        event = conn.next_event()
        assert isinstance(event, h11.Request) and event.target == b"/readyz"
        assert isinstance(conn.next_event(), h11.EndOfMessage)
    return (time.perf_counter() - started) / PARSES


def bench_parse() -> None:
    ours = min(asyncio.run(_parse_hand_written()) for _ in range(3))
    theirs = min(_parse_h11() for _ in range(3))
    emit(
        "probe_parser",
        "parse one kubelet request with h11 (best of 3)",
        theirs * 1e6,
        "us",
        baseline=ours * 1e6,
        target="informs the choice: h11 would have to parse no slower",
        ok=True,
        h11_qualifies=theirs <= ours,
    )


def main() -> None:
    bench_import()
    bench_parse()


if __name__ == "__main__":
    main()
