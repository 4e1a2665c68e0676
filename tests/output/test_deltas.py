"""`DeltaBuffer`: batches under the NOTIFY limit, the rate bound with drops counted, secrets masked whole."""

from __future__ import annotations

from collections.abc import Sequence

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlife._output._deltas import MAX_HELD_CHARS, DeltaBuffer
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
    text = "intro " * 20 + "the key is " + secret + " and more " + "words " * 20 + "last"
    for index in range(0, len(text), 5):  # cut everywhere, flushed after every piece
        buffer.add("job/1/0", text[index : index + 5])
        await buffer.flush()
    assert secret not in sent.text()
    masked = text.replace(secret, "***")
    assert sent.text() == masked[: len(sent.text())]  # what went is the masked text, held back only ...
    assert len(masked) - len(sent.text()) <= len("words last")  # ... the last two words
    buffer.finish("job/1/0")
    await buffer.flush()
    assert sent.text() == masked  # ... until the call ends (its last word too)


async def test_a_retried_call_says_its_text_starts_over_and_calls_stay_apart() -> None:
    sent = Sent()
    buffer = DeltaBuffer(sent, rate=10**9)
    buffer.add("job/0/0", "first try")
    buffer.restart("job/0/0")
    buffer.add("job/0/0", "second")
    buffer.add("job/0/1", "next call")
    await buffer.flush()
    assert [(b["c"], b["t"], b["r"]) for b in sent.batches] == [
        ("job/0/0", "first try", True),  # a call's first text in a process starts over: see below
        ("job/0/0", "second", True),
        ("job/0/1", "next call", True),
    ]
    buffer.add("job/0/1", " goes on")
    await buffer.flush()
    assert (sent.batches[-1]["t"], sent.batches[-1]["r"]) == (" goes on", False)


async def test_a_call_streamed_again_by_the_next_attempt_starts_over_for_its_followers() -> None:
    # An attempt killed mid-reply streamed "The answer be"; the next attempt (this buffer, another process
    # on any pod) streams the same call again. A follower that clears a call's text on "r" shows it once.
    sent = Sent()
    killed = DeltaBuffer(sent, rate=10**9)
    killed.add("job/0/0", "The answer be")
    await killed.flush()
    resumed = DeltaBuffer(sent, rate=10**9)
    resumed.add("job/0/0", "The answer begins here.")
    await resumed.flush()
    shown = ""
    for batch in sent.batches:
        shown = batch["t"] if batch["r"] else shown + batch["t"]
    assert shown == "The answer begins here."


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


WORDS = [
    "the",
    "key",
    "is",
    "sk-ant-api03-" + "Zx9" * 12,
    "Bearer",
    "token:",
    "password=hunter2hunter2",
    "\n",
    "  ",
]
KNOWN = "c0rrect-h0rse-battery"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([*WORDS, KNOWN]), max_size=40), st.lists(st.integers(1, 9), min_size=1))
async def test_text_cut_anywhere_reaches_followers_as_the_whole_text_masked(
    words: list[str], cuts: list[int]
) -> None:
    redactor = Redactor([KNOWN])
    text = " ".join(words)
    sent = Sent()
    buffer = DeltaBuffer(sent, redactor, rate=10**9)
    index, turn = 0, 0
    while index < len(text):
        size = cuts[turn % len(cuts)]
        buffer.add("c", text[index : index + size])
        await buffer.flush()
        index, turn = index + size, turn + 1
    buffer.finish("c")
    await buffer.flush()
    assert KNOWN not in sent.text() and "hunter2hunter2" not in sent.text()
    assert sent.text() == redactor.redact(text)
