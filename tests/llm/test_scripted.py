"""ScriptedLLM: scripted streams replayed through the real guard and assembler; the default client."""

from __future__ import annotations

import pytest

from agentlife import (
    ConfigError,
    LLMClient,
    LLMConfigurationError,
    LLMReply,
    LLMTimeout,
    PermanentError,
    StreamTimeouts,
    TransientError,
    Usage,
)
from agentlife._llm._anthropic import AnthropicLLM
from agentlife._llm._default import UnconfiguredLLM, default_llm
from agentlife._llm._pricing import ModelPrice, PriceTable
from agentlife._llm._scripted import (
    ScriptedEvent,
    ScriptedLLM,
    ScriptedTurn,
    ScriptExhausted,
    estimate_tokens,
)
from agentlife._retry import classify

pytestmark = pytest.mark.anyio

FAST = StreamTimeouts(connect=0.2, chunk=0.15, total=1.0)
MESSAGES = [{"role": "user", "content": "Summarise the release."}]


async def ask(
    llm: ScriptedLLM, *, model: str = "claude-sonnet-4-5", timeouts: StreamTimeouts = FAST
) -> LLMReply:
    return await llm.complete(model=model, messages=MESSAGES, max_tokens=100, timeouts=timeouts)


async def test_text_reply_with_chunks_usage_cost_and_a_record_of_the_call() -> None:
    llm = ScriptedLLM([ScriptedTurn.text("Hello, agent world!", chunks=4, delay=0.005)])
    assert isinstance(llm, LLMClient)
    reply = await llm.complete(
        model="claude-sonnet-4-5", messages=MESSAGES, max_tokens=64, timeouts=FAST, system="be brief"
    )
    assert reply.text == "Hello, agent world!"
    assert reply.content == ({"type": "text", "text": "Hello, agent world!"},)
    assert reply.stop_reason == "end_turn"
    assert reply.model == "claude-sonnet-4-5"
    assert reply.usage.output_tokens == estimate_tokens("Hello, agent world!")
    assert reply.usage.input_tokens > 0
    expected = (reply.usage.input_tokens * 3.0 + reply.usage.output_tokens * 15.0) / 1e6
    assert reply.cost_usd == pytest.approx(expected)
    assert llm.calls == 1
    assert llm.requests[0].max_tokens == 64
    assert llm.requests[0].params == {"system": "be brief"}
    assert llm.requests[0].messages == tuple(MESSAGES)


def test_text_is_split_into_the_requested_deltas() -> None:
    turn = ScriptedTurn.text("abcdefghij", chunks=3, delay=0.01, initial_delay=0.2)
    deltas = [e for e in turn.events if e.event["type"] == "content_block_delta"]
    assert [d.event["delta"]["text"] for d in deltas] == ["abcd", "efg", "hij"]
    assert all(d.delay == 0.01 for d in deltas)
    assert turn.events[0].event["type"] == "message_start"
    assert turn.events[0].delay == 0.2
    assert turn.events[-1].event == {"type": "message_stop"}


async def test_explicit_usage_is_reported_as_given() -> None:
    usage = Usage(input_tokens=1000, output_tokens=200, cache_read_input_tokens=5000)
    reply = await ask(ScriptedLLM([ScriptedTurn.text("ok", usage=usage)]), model="claude-haiku-4-5-20251001")
    assert reply.usage == usage
    assert reply.cost_usd == pytest.approx((1000 * 1.0 + 200 * 5.0 + 5000 * 0.1) / 1e6)


async def test_thinking_and_tool_use_blocks_survive_chunking() -> None:
    tool_input = {"path": "docs/README.md", "lines": [1, 2, 3], "note": "ünïcode"}
    llm = ScriptedLLM(
        [ScriptedTurn.tool_use("read_file", tool_input, thinking="Need the file.", text="Reading.", chunks=5)]
    )
    reply = await ask(llm)
    kinds = [block["type"] for block in reply.content]
    assert kinds == ["thinking", "text", "tool_use"]
    assert reply.content[0]["thinking"] == "Need the file."
    assert reply.content[0]["signature"]
    assert reply.content[2]["input"] == tool_input
    assert reply.content[2]["name"] == "read_file"
    assert reply.stop_reason == "tool_use"
    assert reply.text == "Reading."


async def test_a_stall_is_a_chunk_timeout() -> None:
    llm = ScriptedLLM([ScriptedTurn.stall(after_chunks=2), ScriptedTurn.stall(after_chunks=0)])
    for _ in range(2):
        with pytest.raises(LLMTimeout) as caught:
            await ask(llm)
        assert caught.value.kind == "chunk"


async def test_never_answering_is_a_connect_timeout_and_a_trickle_a_total_timeout() -> None:
    llm = ScriptedLLM([ScriptedTurn.never_answer(), ScriptedTurn.trickle(0.01)])
    with pytest.raises(LLMTimeout) as first:
        await ask(llm)
    with pytest.raises(LLMTimeout) as second:
        await ask(llm, timeouts=StreamTimeouts(connect=0.2, chunk=0.1, total=0.3))
    assert (first.value.kind, second.value.kind) == ("connect", "total")


async def test_pings_during_a_long_think_keep_the_stream_alive_only_if_frequent_enough() -> None:
    timeouts = StreamTimeouts(connect=0.2, chunk=0.15, total=2.0)
    frequent = ScriptedTurn.thinking("Let me think hard.", "42", pause=0.5, ping_every=0.05)
    rare = ScriptedTurn.thinking("Let me think hard.", "42", pause=0.5, ping_every=0.3)
    assert sum(e.event["type"] == "ping" for e in frequent.events) == 10
    llm = ScriptedLLM([frequent, rare])
    reply = await ask(llm, timeouts=timeouts)
    assert reply.text == "42"
    assert reply.content[0] == {
        "type": "thinking",
        "thinking": "Let me think hard.",
        "signature": reply.content[0]["signature"],
    }
    with pytest.raises(LLMTimeout, match="chunk"):
        await ask(llm, timeouts=timeouts)


async def test_http_error_turns_raise_what_the_adapter_would() -> None:
    llm = ScriptedLLM(
        [
            ScriptedTurn.http_error(429, retry_after=1.5),
            ScriptedTurn.http_error(529),
            ScriptedTurn.http_error(400, message="messages: field required"),
            ScriptedTurn.http_error(401),
        ]
    )
    with pytest.raises(TransientError) as rate_limited:
        await ask(llm)
    assert rate_limited.value.retry_after == 1.5
    assert rate_limited.value.status_code == 429  # type: ignore[attr-defined]
    with pytest.raises(TransientError, match="529 overloaded_error"):
        await ask(llm)
    with pytest.raises(PermanentError, match="field required"):
        await ask(llm)
    with pytest.raises(LLMConfigurationError):
        await ask(llm)
    assert llm.calls == 4


async def test_an_error_turn_raises_the_given_exception() -> None:
    boom = ConnectionResetError("scripted reset")
    llm = ScriptedLLM([ScriptedTurn.error(boom)])
    with pytest.raises(ConnectionResetError) as caught:
        await ask(llm)
    assert caught.value is boom


async def test_an_exhausted_script_raises_unless_it_cycles() -> None:
    llm = ScriptedLLM(["one"])
    assert (await ask(llm)).text == "one"
    with pytest.raises(ScriptExhausted, match="1 scripted turn") as caught:
        await ask(llm)
    assert isinstance(caught.value, PermanentError)
    assert not classify(caught.value).retryable
    assert llm.calls == 2
    cycling = ScriptedLLM(["a", "b"], cycle=True)
    assert [(await ask(cycling)).text for _ in range(5)] == ["a", "b", "a", "b", "a"]
    llm.add("two")
    assert (await ask(llm)).text == "two"


async def test_a_recorded_reply_replays_identically() -> None:
    original = await ask(
        ScriptedLLM([ScriptedTurn.tool_use("search", {"q": "drain"}, thinking="hm", text="Searching")])
    )
    recorded = LLMReply.from_json(original.to_json())
    replayed = await ask(ScriptedLLM([ScriptedTurn.from_reply(recorded, chunks=3)]))
    assert replayed.content == original.content
    assert replayed.usage == original.usage
    assert replayed.stop_reason == original.stop_reason
    assert replayed.model == original.model


async def test_a_mid_stream_error_event_is_mapped() -> None:
    start = ScriptedTurn.text("x").events[0]
    error = ScriptedEvent({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    llm = ScriptedLLM([ScriptedTurn(events=(start, error))])
    with pytest.raises(TransientError, match="Overloaded"):
        await ask(llm)


async def test_a_stream_without_message_stop_is_transient() -> None:
    llm = ScriptedLLM([ScriptedTurn(events=ScriptedTurn.text("cut").events[:-1])])
    with pytest.raises(TransientError, match="message_stop"):
        await ask(llm)


async def test_prices_and_timeouts_are_configurable() -> None:
    prices = PriceTable.default().with_prices({"scripted-model": ModelPrice(input=1000.0, output=0.0)})
    llm = ScriptedLLM(
        [ScriptedTurn.text("hi", usage=Usage(input_tokens=1000)), ScriptedTurn.stall()],
        prices=prices,
        env={"AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS": "0.1"},
    )
    assert llm.timeouts == StreamTimeouts(connect=30.0, chunk=0.1, total=300.0)
    reply = await llm.complete(model="scripted-model", messages=MESSAGES, max_tokens=5)
    assert reply.cost_usd == pytest.approx(1.0)
    with pytest.raises(LLMTimeout, match=r"chunk timeout after 0\.1 s"):
        await llm.complete(model="scripted-model", messages=MESSAGES, max_tokens=5)
    with pytest.raises(ConfigError):
        ScriptedLLM(env={"AGENTLIFE_LLM_CONNECT_TIMEOUT_SECONDS": "-1"})


def test_turn_validation() -> None:
    with pytest.raises(ValueError, match="after"):
        ScriptedTurn(after="later")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="400-599"):
        ScriptedTurn.http_error(302)
    with pytest.raises(ValueError, match="ping_every"):
        ScriptedTurn.thinking("a", "b", pause=1.0, ping_every=0)


async def test_default_llm_without_a_key_fails_at_the_first_call_only() -> None:
    llm = default_llm({})
    assert isinstance(llm, UnconfiguredLLM)
    with pytest.raises(LLMConfigurationError, match="ANTHROPIC_API_KEY is not set"):
        await llm.complete(model="claude-sonnet-4-5", messages=MESSAGES, max_tokens=10)
    await llm.aclose()


def test_default_llm_with_a_key_is_the_anthropic_adapter() -> None:
    llm = default_llm(
        {"ANTHROPIC_API_KEY": "sk-ant-api03-abcdefgh", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}
    )
    assert isinstance(llm, AnthropicLLM)
    assert "sk-ant" not in repr(llm)
    assert "127.0.0.1:9" in repr(llm)
