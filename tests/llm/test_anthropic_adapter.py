"""The Anthropic adapter against `FakeAnthropicServer` on 127.0.0.1, over both of its transports.

Every test that takes the ``transport`` fixture runs twice: over agentlife's own HTTP client (httpx, the
default) and through a real ``anthropic.AsyncAnthropic`` passed as ``client=``, so both stay one behaviour.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _net import PROXY_VARIABLES, non_loopback_address
from agentlife import (
    LLMConfigurationError,
    LLMReply,
    LLMTimeout,
    PermanentError,
    StreamTimeouts,
    TransientError,
    Usage,
)
from agentlife._llm._anthropic import AnthropicLLM, MessageAssembler, parse_retry_after
from agentlife._llm._pricing import DEFAULT_PRICES, ModelPrice, PriceTable
from agentlife._llm._protocol import CUT_OFF
from agentlife._llm._scripted import ScriptedEvent, ScriptedTurn
from agentlife._retry import RetryEvent, retry_call
from agentlife.testing._anthropic_server import FakeAnthropicServer

pytestmark = pytest.mark.anyio

KEY = "sk-ant-api03-test-secret-0123456789"
FAST = StreamTimeouts(connect=0.3, chunk=0.2, total=2.0)
#: For the calls that must succeed: a loaded machine's first connect (httpx's imports, TLS context) can take
#: longer than FAST's 0.3 s, and a timeout is not what those tests are about.
ROOMY = StreamTimeouts(connect=15.0, chunk=15.0, total=30.0)
MESSAGES = [{"role": "user", "content": "Review the diff."}]
# A name the SDK will never list as deprecated (its warning would be an error here); priced as a sonnet.
MODEL = "claude-sonnet-agentlife-test"


@pytest.fixture(params=["loopback", "httpx", "sdk"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The default client to a server on 127.0.0.1 (agentlife's loopback client) or on this machine's other
    address (httpx, as a remote API is reached), or a real ``anthropic.AsyncAnthropic``."""
    if request.param == "httpx":
        for variable in PROXY_VARIABLES:
            monkeypatch.delenv(variable, raising=False)
    return str(request.param)


@pytest.fixture
async def server(transport: str) -> AsyncIterator[FakeAnthropicServer]:
    host = non_loopback_address() if transport == "httpx" else "127.0.0.1"
    async with FakeAnthropicServer(api_key=KEY, host=host) as fake:
        yield fake


MakeLLM = Callable[..., AnthropicLLM]


@pytest.fixture
async def make_llm(transport: str) -> AsyncIterator[MakeLLM]:
    """Builds `AnthropicLLM`s over the transport of this run; closes them (and their SDK clients) after."""
    built: list[AnthropicLLM] = []
    sdks: list[Any] = []

    def make(api_key: str = KEY, base_url: str | None = None, **options: Any) -> AnthropicLLM:
        if transport == "sdk":
            import anthropic

            sdk = anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url)
            sdks.append(sdk)
            llm = AnthropicLLM(client=sdk, **options)
            assert llm.uses_sdk
        else:
            llm = AnthropicLLM(api_key=api_key, base_url=base_url, **options)
            assert not llm.uses_sdk
        built.append(llm)
        return llm

    yield make
    for llm in built:
        await llm.aclose()
    for sdk in sdks:
        await sdk.close()


@pytest.fixture
async def llm(server: FakeAnthropicServer, make_llm: MakeLLM) -> AnthropicLLM:
    return make_llm(base_url=server.base_url, timeouts=FAST)


async def ask(llm: AnthropicLLM, timeouts: StreamTimeouts = ROOMY, **params: object) -> LLMReply:
    return await llm.complete(model=MODEL, messages=MESSAGES, max_tokens=256, timeouts=timeouts, **params)


async def test_a_text_stream_gives_text_usage_and_cost(
    server: FakeAnthropicServer, llm: AnthropicLLM
) -> None:
    usage = Usage(
        input_tokens=1200, output_tokens=300, cache_creation_input_tokens=100, cache_read_input_tokens=400
    )
    server.enqueue(ScriptedTurn.text("Looks good to me.", chunks=5, delay=0.005, usage=usage))
    reply = await ask(llm, system="You review code.", stop_sequences=["END"])
    assert reply.text == "Looks good to me."
    assert reply.content == ({"type": "text", "text": "Looks good to me."},)
    assert reply.usage == usage
    assert reply.stop_reason == "end_turn"
    assert reply.model == MODEL
    expected = (1200 * 3.0 + 300 * 15.0 + 100 * 3.75 + 400 * 0.3) / 1e6
    assert reply.cost_usd == pytest.approx(expected)
    [request] = server.requests
    assert request.path == "/v1/messages"
    assert request.body["stream"] is True
    assert request.body["model"] == MODEL
    assert request.body["max_tokens"] == 256
    assert request.body["system"] == "You review code."
    assert request.body["stop_sequences"] == ["END"]
    assert KEY not in str(request.headers)
    assert "***" in (request.headers.get("x-api-key"), request.headers.get("authorization"))
    assert server.completed == 1
    assert server.disconnects == 0


async def test_thinking_and_tool_use_blocks_are_kept(server: FakeAnthropicServer, llm: AnthropicLLM) -> None:
    tool_input = {"command": "kubectl get pods", "namespace": "agents", "flags": ["-o", "json"]}
    server.enqueue(
        ScriptedTurn.tool_use(
            "kubectl_get",
            tool_input,
            id="toolu_01",
            thinking="Check the pods first.",
            text="Let me look.",
            chunks=4,
        )
    )
    reply = await ask(llm)
    assert [b["type"] for b in reply.content] == ["thinking", "text", "tool_use"]
    thinking, text, tool_use = reply.content
    assert thinking["thinking"] == "Check the pods first."
    assert thinking["signature"]
    assert text == {"type": "text", "text": "Let me look."}
    assert tool_use == {"type": "tool_use", "id": "toolu_01", "name": "kubectl_get", "input": tool_input}
    assert reply.stop_reason == "tool_use"


async def test_a_stall_mid_response_is_aborted_at_the_chunk_timeout(
    server: FakeAnthropicServer, llm: AnthropicLLM
) -> None:
    server.enqueue(ScriptedTurn.stall("partial answer that stops", after_chunks=2))
    # A connect clock a loaded machine keeps (a first request through the SDK builds its client): only the
    # chunk clock is under test here.
    timeouts = StreamTimeouts(connect=10.0, chunk=0.2, total=20.0)
    started = time.monotonic()
    with pytest.raises(LLMTimeout) as caught:
        await ask(llm, timeouts)
    assert caught.value.kind == "chunk"
    assert time.monotonic() - started < timeouts.total
    await server.wait_for_disconnects(1)
    assert server.disconnected_requests == (0,)


async def test_a_long_thinking_pause_with_pings_is_not_aborted(
    server: FakeAnthropicServer, llm: AnthropicLLM
) -> None:
    # 0.5 s of thinking: more than twice the chunk timeout, with a ping every 50 ms.
    server.enqueue(ScriptedTurn.thinking("Hmm, tricky.", "The answer is 42.", pause=0.5, ping_every=0.05))
    reply = await ask(llm)
    assert reply.text == "The answer is 42."
    assert reply.content[0]["thinking"] == "Hmm, tricky."
    assert server.disconnects == 0


async def test_accept_and_never_answer_is_a_connect_timeout(
    server: FakeAnthropicServer, llm: AnthropicLLM
) -> None:
    server.enqueue(ScriptedTurn.never_answer())
    with pytest.raises(LLMTimeout) as caught:
        await ask(llm, FAST)
    assert caught.value.kind == "connect"
    await server.wait_for_disconnects(1)


async def test_a_trickle_forever_is_a_total_timeout(server: FakeAnthropicServer, llm: AnthropicLLM) -> None:
    server.enqueue(ScriptedTurn.trickle(0.01))
    timeouts = StreamTimeouts(connect=0.3, chunk=0.1, total=0.4)
    started = time.monotonic()
    with pytest.raises(LLMTimeout) as caught:
        await ask(llm, timeouts)
    assert caught.value.kind == "total"
    assert time.monotonic() - started >= timeouts.total - 0.01
    await server.wait_for_disconnects(1)


async def test_an_outside_cancellation_closes_the_response(
    server: FakeAnthropicServer, llm: AnthropicLLM
) -> None:
    server.enqueue(ScriptedTurn.stall(after_chunks=1))
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, llm, StreamTimeouts(connect=5, chunk=5, total=10))
            await server.wait_for_requests(1, timeout=30)  # the stream is open: cancel it from outside
            await anyio.sleep(0.1)
            scope.cancel()
    assert scope.cancelled_caught
    await server.wait_for_disconnects(1)


async def test_429_and_529_are_retried_within_budget_then_succeed(
    server: FakeAnthropicServer, llm: AnthropicLLM
) -> None:
    server.enqueue(
        ScriptedTurn.http_error(429, retry_after=0.2),
        ScriptedTurn.http_error(529),
        ScriptedTurn.text("finally"),
    )
    events: list[RetryEvent] = []
    started = anyio.current_time()
    reply = await retry_call(
        lambda: ask(llm),
        initial=0.01,
        cap=0.05,
        deadline=started + 3.0,
        rng=random.Random(1),
        on_retry=events.append,
    )
    assert reply.text == "finally"
    assert len(server.requests) == 3
    assert [e.error_type for e in events] == ["TransientError", "TransientError"]
    assert events[0].retry_after == 0.2
    assert events[0].delay >= 0.2
    assert "429 rate_limit_error" in events[0].message
    assert "529 overloaded_error" in events[1].message
    assert anyio.current_time() - started >= 0.2


async def test_retries_stop_at_the_deadline(server: FakeAnthropicServer, llm: AnthropicLLM) -> None:
    server.enqueue(*(ScriptedTurn.http_error(500) for _ in range(20)))
    deadline = anyio.current_time() + 0.4
    with pytest.raises(TransientError, match="500"):
        await retry_call(lambda: ask(llm), initial=0.05, cap=0.1, deadline=deadline, rng=random.Random(2))
    assert anyio.current_time() < deadline + 0.2
    assert 2 <= len(server.requests) < 20


async def test_400_is_permanent_and_not_retried(server: FakeAnthropicServer, llm: AnthropicLLM) -> None:
    server.enqueue(
        ScriptedTurn.http_error(400, message="max_tokens: must be positive"), ScriptedTurn.text("x")
    )
    with pytest.raises(
        PermanentError, match="400 invalid_request_error: max_tokens: must be positive"
    ) as caught:
        await retry_call(lambda: ask(llm), initial=0.01, deadline=anyio.current_time() + 5)
    assert caught.value.status_code == 400  # type: ignore[attr-defined]
    assert len(server.requests) == 1


async def test_401_is_a_configuration_error_that_never_shows_the_key(
    server: FakeAnthropicServer, make_llm: MakeLLM
) -> None:
    wrong = "sk-ant-api03-wrong-key-abcdefghijklmnop"
    client = make_llm(api_key=wrong, base_url=server.base_url)
    with pytest.raises(LLMConfigurationError) as caught:
        await retry_call(lambda: ask(client), initial=0.01)
    assert "401" in str(caught.value)
    assert wrong not in str(caught.value)
    assert wrong not in repr(caught.value)
    assert len(server.requests) == 1


async def test_an_error_event_mid_stream_is_mapped(server: FakeAnthropicServer, llm: AnthropicLLM) -> None:
    start = ScriptedTurn.text("x").events[0]
    overloaded = ScriptedEvent(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )
    server.enqueue(ScriptedTurn(events=(start, overloaded)))
    with pytest.raises(TransientError, match="529 overloaded_error: Overloaded"):
        await ask(llm)


async def test_an_unreachable_server_is_transient_and_keyless(make_llm: MakeLLM) -> None:
    async with FakeAnthropicServer() as gone:
        url = gone.base_url
    client = make_llm(base_url=url)
    with pytest.raises(TransientError, match="cannot reach the Anthropic API at http://127") as caught:
        await ask(client)
    assert KEY not in str(caught.value)


async def test_a_missing_key_fails_before_any_request(server: FakeAnthropicServer) -> None:
    client = AnthropicLLM(base_url=server.base_url, env={})
    with pytest.raises(LLMConfigurationError, match="ANTHROPIC_API_KEY"):
        await ask(client)
    assert server.requests == []


async def test_the_environment_configures_key_url_and_timeouts(
    server: FakeAnthropicServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS", "0.15")
    client = AnthropicLLM()
    server.enqueue(ScriptedTurn.text("from env"), ScriptedTurn.stall())
    try:
        assert (await client.complete(model=MODEL, messages=MESSAGES, max_tokens=8)).text == "from env"
        with pytest.raises(LLMTimeout, match=r"chunk timeout after 0\.15 s"):
            await client.complete(model=MODEL, messages=MESSAGES, max_tokens=8)
    finally:
        await client.aclose()
    assert client.timeouts.chunk == 0.15


async def test_stream_is_not_a_parameter(llm: AnthropicLLM) -> None:
    with pytest.raises(TypeError, match="stream"):
        await ask(llm, stream=False)


def test_the_assembler_keeps_the_latest_usage_and_flags_a_cut_off_tool_input() -> None:
    assembler = MessageAssembler()
    events = [
        {
            "type": "message_start",
            "message": {"model": "m", "usage": {"input_tokens": 10, "output_tokens": 1}},
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "t", "name": "n", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '{"a": '},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens"},
            "usage": {"output_tokens": 7, "input_tokens": None},
        },
        {"type": "message_stop"},
    ]
    for event in events:
        assembler.feed(event)
    reply = assembler.reply()
    assert reply.usage == Usage(input_tokens=10, output_tokens=7)
    assert reply.stop_reason == "max_tokens"
    # Only API fields in the block (it is sent back as it is); why it cannot run is on the reply.
    assert reply.content[0] == {"type": "tool_use", "id": "t", "name": "n", "input": {}}
    assert reply.tool_input_errors == {"t": CUT_OFF}


def test_parse_retry_after() -> None:
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after": "0.25"}) == 0.25
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({}) is None
    assert parse_retry_after({"retry-after": "soon"}) is None
    # Too large for a float is a long wait (each consumer cuts it to its bound), not none.
    assert (
        parse_retry_after({"retry-after": "1e400"}) == parse_retry_after({"retry-after-ms": "9" * 500}) > 1e6
    )
    assert parse_retry_after({"retry-after": "-1e400"}) is None
    in_ten = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 10))
    assert 8.0 <= (parse_retry_after({"retry-after": in_ten}) or 0) <= 10.5


def test_price_table_longest_prefix_overrides_and_unknown_models(caplog: pytest.LogCaptureFixture) -> None:
    table = PriceTable.default()
    million = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert table.cost_usd("claude-opus-4-5-20251101", million) == pytest.approx(30.0)
    assert table.cost_usd("claude-opus-4-1-20250805", million) == pytest.approx(90.0)
    assert table.cost_usd("claude-opus-4-20250514", million) == pytest.approx(90.0)
    assert table.cost_usd("claude-haiku-4-5", million) == pytest.approx(6.0)
    assert table.cost_usd("claude-3-5-haiku-latest", million) == pytest.approx(4.8)
    assert table.cost_usd("claude-sonnet-4-5-20250929", million) == pytest.approx(18.0)
    custom = table.with_prices(
        {"claude-sonnet-4-6": {"input": 1.0, "output": 2.0}, "my-model": ModelPrice(0.5, 0.5)}
    )
    assert custom.cost_usd("claude-sonnet-4-6-20260101", million) == pytest.approx(3.0)
    assert custom.cost_usd("claude-sonnet-4-5", million) == pytest.approx(
        18.0
    )  # the family rate still applies
    assert custom.cost_usd("my-model-v2", million) == pytest.approx(1.0)
    assert table.cost_usd("claude-sonnet-4-6", million) == pytest.approx(18.0)  # the original is unchanged
    with caplog.at_level(logging.WARNING, logger="agentlife.llm"):
        assert table.cost_usd("gpt-unknown", million) == 0.0
        assert table.cost_usd("gpt-unknown", million) == 0.0
    assert sum("gpt-unknown" in r.getMessage() for r in caplog.records) == 1
    assert set(DEFAULT_PRICES) <= set(table.to_json())
    with pytest.raises(ValueError, match="input"):
        ModelPrice(input=-1.0, output=1.0)


# --- what the model did not send whole -----------------------------------------------------------------

MALFORMED = {
    "cut off mid-JSON": (
        ScriptedTurn.malformed_tool_use("cleanup", '{"pattern": "*.tm', stop_reason="max_tokens"),
        "cut off at max_tokens",
    ),
    "cut off before any argument": (
        ScriptedTurn.malformed_tool_use("cleanup", "", stop_reason="max_tokens"),
        "cut off at max_tokens",
    ),
    "an object, not JSON text": (
        ScriptedTurn.malformed_tool_use("cleanup", {"pattern": "*"}),
        "arrived as JSON an object, not as the JSON text",
    ),
    "JSON, not an object": (
        ScriptedTurn.malformed_tool_use("cleanup", "[1, 2]"),
        "JSON an array, not an object",
    ),
    "not JSON": (ScriptedTurn.malformed_tool_use("cleanup", "{pattern: *}"), "not valid JSON"),
}


@pytest.mark.parametrize("case", MALFORMED)
async def test_a_tool_input_that_is_not_what_the_model_sent_is_flagged_and_the_block_stays_api_shaped(
    server: FakeAnthropicServer, llm: AnthropicLLM, case: str
) -> None:
    turn, why = MALFORMED[case]
    server.enqueue(turn)
    reply = await ask(llm)
    assert reply.content == (
        {"type": "tool_use", "id": "toolu_scripted_cleanup", "name": "cleanup", "input": {}},
    )
    assert why in reply.tool_input_errors["toolu_scripted_cleanup"]
    # The flag survives the journal, and the recorded response holds no non-API field.
    recorded = reply.to_json()
    assert "partial_json" not in str(recorded)
    assert LLMReply.from_json(recorded) == reply


async def test_a_whole_tool_input_is_not_flagged(server: FakeAnthropicServer, llm: AnthropicLLM) -> None:
    server.enqueue(ScriptedTurn.tool_use("cleanup", {"pattern": "*.tmp"}, chunks=5))
    reply = await ask(llm)
    assert reply.tool_input_errors == {} and reply.content[0]["input"] == {"pattern": "*.tmp"}
    assert "tool_input_errors" not in reply.to_json()  # journal lines of ordinary replies are unchanged


async def test_a_reply_recorded_by_0_2_with_partial_json_is_flagged_and_never_sent_back(
    server: FakeAnthropicServer, llm: AnthropicLLM
) -> None:
    old_block = {"type": "tool_use", "id": "t1", "name": "cleanup", "input": {}, "partial_json": '{"pat'}
    replayed = LLMReply.from_json({"text": "", "content": [old_block], "stop_reason": "tool_use"})
    assert replayed.content == ({"type": "tool_use", "id": "t1", "name": "cleanup", "input": {}},)
    assert "not valid JSON" in replayed.tool_input_errors["t1"]
    # A conversation saved by 0.2 still holds the field: the adapter leaves it out of the request.
    server.enqueue("ok")
    conversation = [
        *MESSAGES,
        {"role": "assistant", "content": [old_block]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x", "is_error": True}],
        },
    ]
    await llm.complete(model=MODEL, messages=conversation, max_tokens=10, timeouts=FAST)
    sent = server.requests[0].body["messages"]
    assert sent[1]["content"] == [{"type": "tool_use", "id": "t1", "name": "cleanup", "input": {}}]
    assert conversation[1]["content"][0]["partial_json"] == '{"pat'  # the caller's list is not changed


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ("<html><head><title>Sign in</title></head><body>SSO</body></html>", "text/html; charset=utf-8"),
        ('{"id": "msg_1", "type": "message", "content": []}', "application/json"),
    ],
    ids=["html", "json"],
)
async def test_a_200_that_is_not_a_stream_fails_at_once_naming_its_content_type(
    server: FakeAnthropicServer, llm: AnthropicLLM, body: str, content_type: str
) -> None:
    server.enqueue(ScriptedTurn.raw(body, content_type=content_type), "never sent")
    with pytest.raises(PermanentError) as caught:
        await retry_call(lambda: ask(llm), initial=0.01, deadline=anyio.current_time() + 5)
    assert len(server.requests) == 1  # not retried as a dropped stream
    message = str(caught.value)
    assert f"answered 200 with {content_type}, not a stream of SSE" in message
    assert server.base_url in message and "\n" not in message


async def test_a_502_html_page_is_transient(server: FakeAnthropicServer, llm: AnthropicLLM) -> None:
    server.enqueue(ScriptedTurn.raw("<html><body>502 Bad Gateway</body></html>", status=502), "back")
    events: list[RetryEvent] = []
    reply = await retry_call(
        lambda: ask(llm), initial=0.01, cap=0.02, deadline=anyio.current_time() + 5, on_retry=events.append
    )
    assert reply.text == "back" and len(server.requests) == 2
    assert "502" in events[0].message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(raw=st.text(max_size=40) | json_values.map(lambda v: orjson.dumps(v).decode()))
def test_a_tool_input_is_either_exactly_what_was_sent_or_flagged(raw: str) -> None:
    for stop_reason in ("tool_use", "max_tokens"):
        reply = _assembled(ScriptedTurn.malformed_tool_use("t", raw, stop_reason=stop_reason))
        [block] = reply.content
        problem = reply.tool_input_errors.get("toolu_scripted_t")
        if stop_reason == "max_tokens":
            assert problem is not None  # cut off inside the call: never run, whatever parsed
        elif problem is None:
            assert block["input"] == (orjson.loads(raw) if raw.strip() else {})
            assert isinstance(block["input"], dict)
        else:
            assert block["input"] == {}


@settings(max_examples=200, deadline=None)
@given(arguments=st.dictionaries(st.text(max_size=8), json_values, min_size=1, max_size=4), data=st.data())
def test_any_cut_of_a_tool_input_at_max_tokens_is_flagged(
    arguments: dict[str, object], data: st.DataObject
) -> None:
    text = orjson.dumps(arguments).decode()
    cut = data.draw(st.integers(min_value=0, max_value=len(text)))
    reply = _assembled(ScriptedTurn.malformed_tool_use("t", text[:cut], stop_reason="max_tokens"))
    assert "cut off at max_tokens" in reply.tool_input_errors["toolu_scripted_t"]  # even when it parses


def _assembled(turn: ScriptedTurn) -> LLMReply:
    assembler = MessageAssembler()
    for scripted in turn.stream_events(model="m", messages=[]):
        assembler.feed(scripted.event)
    return assembler.reply()


async def test_line_separators_inside_the_text_are_text_not_sse_line_breaks(
    server: FakeAnthropicServer, llm: AnthropicLLM
) -> None:
    # The server's JSON carries U+2028, U+2029, U+0085, form feed and vertical tab raw; SSE ends lines at
    # CR and LF only, so none of them may cut an event in two (a lost delta would be a silently wrong reply).
    text = "one\u2028two\u2029three\x85four\x0cfive\x0bsix\x1cseven"
    server.enqueue(ScriptedTurn.text(text, chunks=3))
    reply = await ask(llm)
    assert reply.text == text
