"""`DeltaBuffer`: batches under the NOTIFY limit, the rate bound with drops counted, secrets masked whole."""

from __future__ import annotations

from collections.abc import Sequence

import orjson
import pytest

from agentlife._output._deltas import HOLD_CHARS, MAX_HELD_CHARS, DeltaBuffer
from agentlife._redact import Redactor
from agentlife.stores._pg_statements import NOTIFY_PAYLOAD_LIMIT

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Sent:
    def __init__(self, fail: bool = False) -> None:
        self.writes: list[list[dict[str, object]]] = []
        self.fail = fail

    async def __call__(self, payloads: Sequence[str]) -> None:
        if self.fail:
            raise ConnectionError("the store went away")
        self.writes.append([orjson.loads(p) for p in payloads])

    @property
    def batches(self) -> list[dict[str, object]]:
        return [batch for write in self.writes for batch in write]

    def text(self) -> str:
        return "".join(str(batch["t"]) for batch in self.batches)


async def test_each_flush_is_one_write_whose_batches_stay_under_the_notify_limit() -> None:
    sent = Sent()
    buffer = DeltaBuffer(sent, rate=10**9)
    worst = "\x1f" * 5000 + "\U0001f600" * 3000 + "\udcff"  # 6 bytes of JSON each, 4 bytes, a lone surrogate
    for index in range(0, len(worst), 7):
        buffer.add("job/0/0", worst[index : index + 7])
    await buffer.flush()
    assert len(sent.writes) == 1 and buffer.writes == 1
    assert all(len(orjson.dumps(batch)) < NOTIFY_PAYLOAD_LIMIT for batch in sent.batches)
    assert sent.text() == worst[:-1] + "?"  # the lone surrogate cannot travel as JSON: replaced
    await buffer.flush()
    assert len(sent.writes) == 1  # nothing buffered, nothing written


async def test_text_past_the_rate_is_dropped_counted_and_said_in_the_next_batch() -> None:
    sent, clock = Sent(), Clock()
    buffer = DeltaBuffer(sent, rate=100, clock=clock)
    buffer.add("c", "a" * 60)
    buffer.add("c", "b" * 60)  # over the 100 bytes a second: dropped, never waited for
    assert buffer.dropped == 60
    clock.now = 1.0
    buffer.add("c", "c" * 50)
    await buffer.flush()
    assert [(b["t"], b["d"]) for b in sent.batches] == [("a" * 60 + "c" * 50, 60)]
    clock.now = 2.0
    buffer.add("c", "d")
    await buffer.flush()
    assert sent.batches[-1]["d"] == 0  # said once


async def test_a_store_that_takes_nothing_costs_the_step_nothing_and_keeps_two_seconds_at_most() -> None:
    sent, clock = Sent(fail=True), Clock()
    buffer = DeltaBuffer(sent, rate=100, clock=clock)
    for second in range(10):  # the store is down for ten seconds of streaming: the buffer does not grow
        clock.now = float(second)
        buffer.add("c", "x" * 100)
    assert buffer._pending_bytes <= 200 and buffer.dropped == 800
    await buffer.flush()  # fails: counted, not raised
    assert buffer.failures == 1 and buffer.writes == 0


async def test_a_secret_cut_across_deltas_is_masked_whole_and_the_tail_goes_when_the_call_ends() -> None:
    secret = "sk-live-abcdefghijklmnopqrstuvwxyz0123456789"
    sent = Sent()
    buffer = DeltaBuffer(sent, Redactor([secret]), rate=10**9)
    text = "intro " * 20 + "the key is " + secret + " and more " + "words " * 20
    for index in range(0, len(text), 5):  # cut everywhere, flushed after every piece
        buffer.add("job/1/0", text[index : index + 5])
        await buffer.flush()
    assert secret not in sent.text()
    masked = text.replace(secret, "***")
    held = len(masked) - len(sent.text())
    assert 0 < held <= max(HOLD_CHARS, len(secret)) + len("words ")  # the tail is held back (whole words) ...
    buffer.finish("job/1/0")
    await buffer.flush()
    assert sent.text() == masked  # ... until the call ends


async def test_a_retried_call_says_its_text_starts_over_and_calls_stay_apart() -> None:
    sent = Sent()
    buffer = DeltaBuffer(sent, rate=10**9)
    buffer.add("job/0/0", "first try")
    buffer.restart("job/0/0")
    buffer.add("job/0/0", "second")
    buffer.add("job/0/1", "next call")
    await buffer.flush()
    assert [(b["c"], b["t"], b["r"]) for b in sent.batches] == [
        ("job/0/0", "first try", False),
        ("job/0/0", "second", True),
        ("job/0/1", "next call", False),
    ]


@pytest.mark.parametrize(
    "secret_text",
    [
        "postgresql://app:pa ss/#?@word@db.internal:5432/x",  # a URL password with a space and /#?@
        "Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123456789ABCDEF",
        "ghp_" + "a1B2c3D4e5F6g7H8i9J0" * 2,
        "eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiIxMjM0NTY3ODkwIn0" * 4 + ".c2lnbmF0dXJlc2lnbmF0dXJl",
    ],
)
async def test_secret_shapes_cut_anywhere_are_masked_as_the_whole_text_is(secret_text: str) -> None:
    sent = Sent()
    buffer = DeltaBuffer(sent, Redactor(url_passwords=["pa ss/#?@word"]), rate=10**9)
    text = "before " * 12 + secret_text + " after " * 12
    for index in range(0, len(text), 3):
        buffer.add("c", text[index : index + 3])
        await buffer.flush()
    buffer.finish("c")
    await buffer.flush()
    assert sent.text() == Redactor(url_passwords=["pa ss/#?@word"]).redact(text)
    assert sent.text() != text


async def test_a_long_reply_under_a_secret_shape_costs_linear_time_and_holds_a_bounded_tail() -> None:
    sent = Sent()
    buffer = DeltaBuffer(sent, Redactor(["sk-live-0123456789"]), rate=10**9)
    for _ in range(400):  # 200 KB of one secret-shaped run, flushed every 500 bytes
        buffer.add("c", "k-" + "a" * 498)
        await buffer.flush()
    assert sum(len(held) for held in buffer._held.values()) <= MAX_HELD_CHARS + 500
    assert len(sent.text()) > 190_000
