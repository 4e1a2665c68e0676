"""The OpenAI-compatible adapter against `FakeOpenAIServer`, over both transports.

On 127.0.0.1 the adapter speaks through agentlife's own loopback client; on this machine's other address,
through httpx, as it speaks to a remote server.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _net import PROXY_VARIABLES, non_loopback_address
from agentlife import (
    ConfigError,
    LLMConfigurationError,
    LLMReply,
    LLMTimeout,
    OpenAICompatibleLLM,
    PermanentError,
    ScriptedTurn,
    StreamTimeouts,
    TransientError,
    Usage,
)
from agentlife._llm import _loopback_http as wire
from agentlife._llm._anthropic import AnthropicLLM
from agentlife._llm._default import UnconfiguredLLM, default_llm
from agentlife._llm._openai import key_required
from agentlife._llm._pricing import PriceTable
from agentlife._llm._protocol import CURRENT_CALL, INVOCATION_HEADER, CallAddress, StreamEvent
from agentlife._llm._scripted import ScriptedEvent
from agentlife._llm._transport import HttpxTransport
from agentlife._retry import retry_call
from agentlife.testing import FakeAnthropicServer, FakeOpenAIServer

pytestmark = pytest.mark.anyio

KEY = "sk-proj-test-secret-0123456789abcdef"
FAST = StreamTimeouts(connect=0.5, chunk=0.2, total=3.0)
MESSAGES = [{"role": "user", "content": "Label issue 7."}]
MODEL = "gpt-4o-mini"


@pytest.fixture(params=["loopback", "httpx"])
async def server(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[FakeOpenAIServer]:
    """The server on 127.0.0.1 (agentlife's own client) or on this machine's other address (httpx)."""
    host = "127.0.0.1"
    if request.param == "httpx":
        host = non_loopback_address()
        for variable in PROXY_VARIABLES:
            monkeypatch.delenv(variable, raising=False)
    async with FakeOpenAIServer(api_key=KEY, host=host) as fake:
        yield fake


@pytest.fixture
async def llm(server: FakeOpenAIServer) -> AsyncIterator[OpenAICompatibleLLM]:
    client = OpenAICompatibleLLM(server.base_url, api_key=KEY, timeouts=FAST)
    yield client
    await client.aclose()


async def ask(llm: OpenAICompatibleLLM, **params: object) -> LLMReply:
    return await llm.complete(model=MODEL, messages=MESSAGES, max_tokens=256, **params)  # type: ignore[arg-type]


async def test_a_server_on_127_0_0_1_is_reached_without_httpx_any_other_through_it(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    server.enqueue(ScriptedTurn.text("Labelled.", chunks=2))
    reply = await ask(llm)
    assert reply.text == "Labelled." and len(server.requests) == 1
    transport = await llm._client_holder.get()
    loopback = server.base_url.startswith("http://127.0.0.1:")
    assert type(transport) is (wire.Client if loopback else HttpxTransport)


async def test_a_text_stream_gives_text_usage_cost_and_events(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    usage = Usage(input_tokens=1000, output_tokens=200, cache_read_input_tokens=4000)
    server.enqueue(ScriptedTurn.text("Labelled as a bug.", chunks=4, delay=0.002, usage=usage))
    events: list[StreamEvent] = []
    reply = await ask(
        llm, system="You triage issues.", stop_sequences=["END"], temperature=0.2, on_event=events.append
    )
    assert reply.text == "Labelled as a bug."
    assert reply.content == ({"type": "text", "text": "Labelled as a bug."},)
    assert reply.stop_reason == "end_turn"
    assert reply.model == MODEL
    # Cached prompt tokens are reported inside prompt_tokens and come back as cache reads, not input.
    assert reply.usage == usage
    assert reply.cost_usd == pytest.approx((1000 * 0.15 + 4000 * 0.075 + 200 * 0.60) / 1e6)
    assert [e.text for e in events if e.kind == "text"] == ["Label", "led a", "s a ", "bug."]
    assert all(e.raw.get("object") == "chat.completion.chunk" for e in events)

    [request] = server.requests
    assert request.path == "/v1/chat/completions"
    body = request.body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == MODEL and body["max_tokens"] == 256
    assert body["messages"] == [
        {"role": "system", "content": "You triage issues."},
        {"role": "user", "content": "Label issue 7."},
    ]
    assert body["stop"] == ["END"] and body["temperature"] == 0.2
    assert "stop_sequences" not in body and "system" not in body
    assert request.headers["authorization"] == "***"
    assert request.invocation is None
    assert server.completed == 1 and server.disconnects == 0


async def test_a_tool_call_round_trip_maps_both_ways(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    server.enqueue(
        ScriptedTurn.tool_use(
            "label_issue", {"number": 7, "labels": ["bug"]}, id="call_abc", text="Labelling.", chunks=3
        ),
        "Done: labelled.",
    )
    tools = [
        {
            "name": "label_issue",
            "description": "Put labels on an issue.",
            "input_schema": {"type": "object", "properties": {"number": {"type": "integer"}}},
        }
    ]
    first = await ask(llm, tools=tools, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert first.stop_reason == "tool_use"
    assert first.content == (
        {"type": "text", "text": "Labelling."},
        {
            "type": "tool_use",
            "id": "call_abc",
            "name": "label_issue",
            "input": {"number": 7, "labels": ["bug"]},
        },
    )
    body = server.requests[0].body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "label_issue",
                "description": "Put labels on an issue.",
                "parameters": {"type": "object", "properties": {"number": {"type": "integer"}}},
            },
        }
    ]
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False

    conversation = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}, *first.content],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_abc",
                    "content": [{"type": "text", "text": "ok"}],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "call_def",
                    "content": "no such label",
                    "is_error": True,
                },
                {"type": "text", "text": "Go on."},
            ],
        },
    ]
    second = await llm.complete(
        model=MODEL,
        messages=conversation,
        max_tokens=64,
        system=[{"type": "text", "text": "Be brief."}],
        tools=tools,
        tool_choice={"type": "tool", "name": "label_issue"},
    )
    assert second.text == "Done: labelled."
    body = server.requests[1].body
    assert body["tool_choice"] == {"type": "function", "function": {"name": "label_issue"}}
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Label issue 7."},
        {
            "role": "assistant",
            "content": "Labelling.",
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "label_issue", "arguments": '{"number":7,"labels":["bug"]}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": "ok"},
        {"role": "tool", "tool_call_id": "call_def", "content": "Error: no such label"},
        {"role": "user", "content": "Go on."},
    ]


async def test_line_separators_inside_text_and_arguments_are_text_not_sse_line_breaks(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    # The server's JSON carries U+2028, U+2029 and U+0085 raw (JSON escapes only what is below U+0020);
    # SSE ends lines at CR and LF alone, so none of them may cut a chunk into two halves that are not JSON
    # and are skipped: a lost delta is a silently wrong reply, a lost argument a tool run on less.
    text = "one\u2028two\u2029three\x85four\x0cfive\x0bsix\x1cseven"
    arguments = {"note": "a\u2028b\x85c\u2029d"}
    server.enqueue(ScriptedTurn.tool_use("label_issue", arguments, id="call_1", text=text, chunks=3))
    reply = await ask(llm)
    assert reply.text == text
    assert reply.content[-1]["input"] == arguments and reply.tool_input_errors == {}


async def test_thinking_deltas_become_a_thinking_block_and_thinking_events(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    server.enqueue(ScriptedTurn.thinking("Weigh the labels.", "bug", pause=0.3, ping_every=0.05))
    events: list[StreamEvent] = []
    reply = await ask(llm, on_event=events.append)  # chunk timeout 0.2 s: the keep-alives carry the pause
    assert reply.content[0] == {"type": "thinking", "thinking": "Weigh the labels."}
    assert reply.text == "bug"
    assert "".join(e.text for e in events if e.kind == "thinking") == "Weigh the labels."
    assert "".join(e.text for e in events if e.kind == "text") == "bug"
    assert any(e.kind == "other" for e in events)  # the role chunk, the finish chunk, the usage chunk


async def test_reasoning_models_get_max_completion_tokens(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    server.enqueue("ok", "ok")
    await llm.complete(model="o4-mini", messages=MESSAGES, max_tokens=99)
    await ask(llm, max_completion_tokens=55, thinking={"type": "enabled"}, extra_body={"seed": 3})
    assert (
        server.requests[0].body["max_completion_tokens"] == 99 and "max_tokens" not in server.requests[0].body
    )
    body = server.requests[1].body
    assert body["max_completion_tokens"] == 55 and "max_tokens" not in body
    assert "thinking" not in body and body["seed"] == 3


async def test_a_stall_is_a_chunk_timeout_and_the_server_sees_the_disconnect(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    server.enqueue(ScriptedTurn.stall(after_chunks=2))
    with pytest.raises(LLMTimeout) as caught:
        await ask(llm)
    assert caught.value.kind == "chunk"
    await server.wait_for_disconnects(1)
    assert server.disconnected_requests == (0,)


async def test_accept_and_never_answer_is_a_connect_timeout(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    server.enqueue(ScriptedTurn.never_answer())
    with pytest.raises(LLMTimeout) as caught:
        await ask(llm)
    assert caught.value.kind == "connect"
    await server.wait_for_disconnects(1)


async def test_a_trickle_of_keepalives_is_a_total_timeout(server: FakeOpenAIServer) -> None:
    server.enqueue(ScriptedTurn.trickle(0.02))
    llm = OpenAICompatibleLLM(server.base_url, api_key=KEY, timeouts=StreamTimeouts(1.0, 0.2, 0.6))
    try:
        with pytest.raises(LLMTimeout) as caught:
            await ask(llm)
        assert caught.value.kind == "total"
    finally:
        await llm.aclose()


async def test_429_carries_retry_after_and_500_is_transient(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    server.enqueue(ScriptedTurn.http_error(429, retry_after=7), ScriptedTurn.http_error(500), "fine")
    with pytest.raises(TransientError) as rate:
        await ask(llm)
    assert rate.value.retry_after == 7.0
    assert getattr(rate.value, "status_code", None) == 429
    assert "rate_limit_exceeded" in str(rate.value) and "scripted rate limit" in str(rate.value)
    with pytest.raises(TransientError) as server_error:
        await ask(llm)
    assert getattr(server_error.value, "status_code", None) == 500
    assert (await ask(llm)).text == "fine"


@pytest.mark.parametrize("status", [400, 404, 422])
async def test_request_errors_are_permanent(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM, status: int
) -> None:
    server.enqueue(ScriptedTurn.http_error(status, message="bad field 'x'"))
    with pytest.raises(PermanentError, match=f"OpenAI-compatible API error {status}.*bad field 'x'"):
        await ask(llm)


async def test_401_and_403_are_configuration_errors_and_the_key_never_shows(server: FakeOpenAIServer) -> None:
    wrong = "sk-proj-wrong-key-9876543210fedcba"
    llm = OpenAICompatibleLLM(server.base_url, api_key=wrong, timeouts=FAST)
    try:
        with pytest.raises(LLMConfigurationError) as unauthorised:
            await ask(llm)
    finally:
        await llm.aclose()
    # A server that quotes the key back in its error (some proxies do): the adapter masks it.
    async with FakeOpenAIServer(
        [ScriptedTurn.http_error(403, message=f"key {wrong} may not use this model")]
    ) as fake:
        quoting = OpenAICompatibleLLM(fake.base_url, api_key=wrong, timeouts=FAST)
        try:
            with pytest.raises(LLMConfigurationError) as forbidden:
                await ask(quoting)
        finally:
            await quoting.aclose()
    assert "401" in str(unauthorised.value) and "OPENAI_API_KEY" in str(unauthorised.value)
    assert "403" in str(forbidden.value) and "key *** may not" in str(forbidden.value)
    for text in (str(unauthorised.value), str(forbidden.value), repr(llm), repr(unauthorised.value)):
        assert wrong not in text
    assert repr(llm) == f"OpenAICompatibleLLM(base_url={server.base_url!r}, api_key='***')"


async def test_an_unreachable_server_is_transient_and_keyless() -> None:
    llm = OpenAICompatibleLLM("http://127.0.0.1:9/v1", api_key=KEY, timeouts=FAST)
    try:
        with pytest.raises(TransientError, match="cannot reach the OpenAI-compatible API") as caught:
            await ask(llm)
    finally:
        await llm.aclose()
    assert KEY not in str(caught.value)


async def test_a_stream_cut_before_its_finish_reason_is_transient(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    # The turn ends without message_delta / message_stop: no finish_reason, no [DONE], then EOF.
    full = ScriptedTurn.text("cut short", chunks=3)
    server.enqueue(ScriptedTurn(events=full.events[:4]))
    with pytest.raises(TransientError, match="before a finish_reason"):
        await ask(llm)


async def test_an_error_object_mid_stream_is_mapped(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    # vLLM and LiteLLM report a failure after the headers as a data chunk holding an error object.
    from agentlife._llm._openai_format import ChatAssembler

    assembler = ChatAssembler()
    with pytest.raises(TransientError, match="503"):
        assembler.feed({"error": {"message": "engine overloaded", "type": "server_error", "code": 503}})
    with pytest.raises(PermanentError, match="context length"):
        assembler.feed({"error": {"message": "context length exceeded", "code": 400}})


async def test_the_invocation_header_is_sent_inside_a_call(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    server.enqueue("one", "two")
    token = CURRENT_CALL.set(CallAddress("job-7", 3, 1))
    try:
        await ask(llm)
        await ask(llm)
    finally:
        CURRENT_CALL.reset(token)
    assert [r.headers[INVOCATION_HEADER] for r in server.requests] == ["job-7/3/1", "job-7/3/1"]
    assert server.requests_by_invocation() == {"job-7/3/1": 2}


async def test_a_missing_key_fails_only_for_openai_itself() -> None:
    openai = OpenAICompatibleLLM(env={})
    assert openai.base_url == "https://api.openai.com/v1"
    with pytest.raises(LLMConfigurationError, match="OPENAI_API_KEY is not set"):
        await ask(openai)
    assert key_required("https://api.openai.com/v1") and not key_required("http://localhost:11434/v1")
    # A local server (vLLM, Ollama) is called without an Authorization header.
    async with FakeOpenAIServer(["no key needed"]) as fake:
        local = OpenAICompatibleLLM(env={"OPENAI_BASE_URL": fake.base_url})
        try:
            assert (await ask(local)).text == "no key needed"
        finally:
            await local.aclose()
        assert "authorization" not in fake.requests[0].headers


async def test_stream_is_not_a_parameter(llm: OpenAICompatibleLLM) -> None:
    with pytest.raises(TypeError, match="always streams"):
        await ask(llm, stream=False)


async def test_an_unsupported_block_is_a_permanent_error(llm: OpenAICompatibleLLM) -> None:
    with pytest.raises(PermanentError, match="'document'"):
        await llm.complete(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}],
        )


# --- provider choice -------------------------------------------------------------------------------------


async def test_make_llm_picks_the_provider_from_the_environment() -> None:
    chosen = default_llm({"AGENTLIFE_LLM_PROVIDER": "openai", "OPENAI_BASE_URL": "http://127.0.0.1:8000/v1/"})
    assert isinstance(chosen, OpenAICompatibleLLM) and chosen.base_url == "http://127.0.0.1:8000/v1"
    assert isinstance(
        default_llm({"AGENTLIFE_LLM_PROVIDER": "OpenAI", "OPENAI_API_KEY": KEY}), OpenAICompatibleLLM
    )
    assert isinstance(default_llm({"ANTHROPIC_API_KEY": "sk-ant-test-0123456789"}), AnthropicLLM)
    assert isinstance(default_llm({"AGENTLIFE_LLM_PROVIDER": "anthropic"}), UnconfiguredLLM)
    with pytest.raises(ConfigError) as caught:
        default_llm({"AGENTLIFE_LLM_PROVIDER": "gemini"})
    assert str(caught.value) == "AGENTLIFE_LLM_PROVIDER='gemini' is not a provider: use anthropic or openai"


def test_settings_refuse_an_unknown_provider_at_boot() -> None:
    from agentlife._config import Settings

    base = {"AGENTLIFE_JOB_ID": "j", "AGENTLIFE_AGENT_ID": "a"}
    assert Settings.from_env(base).llm_provider == "anthropic"
    assert Settings.from_env({**base, "AGENTLIFE_LLM_PROVIDER": "openai"}).llm_provider == "openai"
    with pytest.raises(ConfigError, match="use anthropic or openai"):
        Settings.from_env({**base, "AGENTLIFE_LLM_PROVIDER": "bedrock"})


def test_openai_prices() -> None:
    table = PriceTable.default()
    million = Usage(input_tokens=1_000_000, output_tokens=1_000_000, cache_read_input_tokens=1_000_000)
    assert table.cost_usd("gpt-4o-2024-08-06", million) == pytest.approx(2.50 + 10.00 + 1.25)
    assert table.cost_usd("gpt-4.1-nano", million) == pytest.approx(0.10 + 0.40 + 0.025)
    assert table.cost_usd("gpt-5-mini-2025-08-07", million) == pytest.approx(0.25 + 2.00 + 0.025)
    assert table.cost_usd("o4-mini", million) == pytest.approx(1.10 + 4.40 + 0.275)
    assert table.cost_usd("o3", million) == pytest.approx(2.00 + 8.00 + 0.50)


# --- both fake servers: turns addressed by (step, call) --------------------------------------------------


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_turns_addressed_by_step_and_call(kind: str) -> None:
    script = {
        (0, 0): "step zero",
        (1, 0): [ScriptedTurn.stall(after_chunks=1), "step one, second try"],
        (2, 0): "step two",
    }
    fake_cls = FakeAnthropicServer if kind == "anthropic" else FakeOpenAIServer
    async with fake_cls(script, api_key=KEY) as fake:
        llm: OpenAICompatibleLLM | AnthropicLLM
        if kind == "openai":
            llm = OpenAICompatibleLLM(fake.base_url, api_key=KEY, timeouts=FAST)
        else:
            llm = AnthropicLLM(api_key=KEY, base_url=fake.base_url, timeouts=FAST)
        try:

            async def at(step: int) -> str:
                token = CURRENT_CALL.set(CallAddress("job-1", step, 0))
                try:
                    return (
                        await llm.complete(
                            model="claude-sonnet-agentlife-test", messages=MESSAGES, max_tokens=9
                        )
                    ).text
                finally:
                    CURRENT_CALL.reset(token)

            # A resumed process starts at step 2: it gets step 2's turn, not the script's first.
            assert await at(2) == "step two"
            with pytest.raises(LLMTimeout):
                await at(1)
            assert await at(1) == "step one, second try"
            assert await at(1) == "step one, second try"  # the last turn of a call repeats
            with pytest.raises(PermanentError, match="no scripted turn for step 5, call 0"):
                await at(5)
            # Without the header: key order.
            reply = await llm.complete(model="claude-sonnet-agentlife-test", messages=MESSAGES, max_tokens=9)
            assert reply.text == "step zero"
        finally:
            await llm.aclose()
        assert fake.requests_by_invocation() == {"job-1/2/0": 1, "job-1/1/0": 3, "job-1/5/0": 1}


async def test_the_fake_translates_every_event_kind() -> None:
    from agentlife.testing._openai_server import chat_chunks

    turn = ScriptedTurn.tool_use("search", {"q": "x"}, id="t1", thinking="hmm", text="Looking.")
    events = turn.stream_events(model="m", messages=[])
    pings = (ScriptedEvent({"type": "ping"}),)
    data = b"".join(chunk for _, chunk in chat_chunks(pings + events, model="m"))
    assert data.startswith(b": keep-alive\n\n")
    assert b'"reasoning_content":"hmm"' in data and b'"content":"Looking."' in data
    assert b'"finish_reason":"tool_calls"' in data and data.endswith(b"data: [DONE]\n\n")


async def test_a_server_that_does_not_stream_is_a_permanent_error() -> None:
    from aiohttp import web

    async def whole(request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"message": {"content": "hi"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", whole)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    llm = OpenAICompatibleLLM(f"http://127.0.0.1:{port}/v1", api_key=KEY, timeouts=FAST)
    try:
        with pytest.raises(PermanentError, match=r"answered with application/json.*, not a stream of SSE"):
            await ask(llm)
    finally:
        await llm.aclose()
        await runner.cleanup()


# --- what the model did not send whole -----------------------------------------------------------------

MALFORMED = {
    "finish_reason length mid-JSON": (
        ScriptedTurn.malformed_tool_use("cleanup", '{"pattern": "*.tm', stop_reason="max_tokens"),
        "cut off at max_tokens",
    ),
    "finish_reason length before any argument": (
        ScriptedTurn.malformed_tool_use("cleanup", "", stop_reason="max_tokens"),
        "cut off at max_tokens",
    ),
    "arguments as an object": (
        ScriptedTurn.malformed_tool_use("cleanup", {"pattern": "*"}),
        "function.arguments arrived as JSON an object, not as the JSON string",
    ),
    "an empty object, not a string": (
        ScriptedTurn.malformed_tool_use("cleanup", {}),
        "function.arguments arrived as JSON an object",
    ),
    "JSON, not an object": (ScriptedTurn.malformed_tool_use("cleanup", "7"), "JSON a number, not an object"),
    "not JSON": (ScriptedTurn.malformed_tool_use("cleanup", "{pattern: *}"), "not valid JSON"),
}


@pytest.mark.parametrize("case", MALFORMED)
async def test_arguments_that_are_not_what_the_model_sent_are_flagged(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM, case: str
) -> None:
    turn, why = MALFORMED[case]
    server.enqueue(turn)
    reply = await ask(llm)
    assert reply.content == (
        {"type": "tool_use", "id": "toolu_scripted_cleanup", "name": "cleanup", "input": {}},
    )
    assert why in reply.tool_input_errors["toolu_scripted_cleanup"]
    assert "partial_json" not in str(reply.to_json())


async def test_a_tool_without_parameters_may_send_no_arguments(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    server.enqueue(ScriptedTurn.malformed_tool_use("list_files", ""), ScriptedTurn.tool_use("list_files", {}))
    for _ in range(2):  # "" and "{}" both mean no arguments when the call was not cut off
        reply = await ask(llm)
        assert reply.stop_reason == "tool_use" and reply.tool_input_errors == {}
        assert reply.content[0]["input"] == {}


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ("<!doctype html><html><body>Please log in</body></html>", "text/html; charset=utf-8"),
        ("data: not really\n\n", "text/plain"),
    ],
    ids=["html", "text"],
)
async def test_a_200_that_is_not_a_stream_fails_at_once_naming_its_content_type(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM, body: str, content_type: str
) -> None:
    server.enqueue(ScriptedTurn.raw(body, content_type=content_type), "never sent")
    with pytest.raises(PermanentError, match=f"answered with {content_type}, not a stream of SSE"):
        await retry_call(lambda: ask(llm), initial=0.01, deadline=anyio.current_time() + 5)
    assert len(server.requests) == 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    raw=st.text(max_size=40) | json_values | json_values.map(lambda v: orjson.dumps(v).decode()),
    stop_reason=st.sampled_from(["tool_use", "max_tokens"]),
)
def test_arguments_are_either_exactly_what_was_sent_or_flagged(raw: object, stop_reason: str) -> None:
    """Through the fake server's own translation to chunks, any ``function.arguments`` the server sends."""
    from agentlife._llm._openai_format import ChatAssembler
    from agentlife.testing._openai_server import chat_chunks

    turn = ScriptedTurn.malformed_tool_use("t", raw, stop_reason=stop_reason)
    assembler = ChatAssembler()
    for _, data in chat_chunks(turn.stream_events(model="m", messages=[]), model="m"):
        if data.startswith(b"data: {"):
            assembler.feed(orjson.loads(data[len(b"data: ") :]))
    reply = assembler.reply()
    [block] = reply.content
    problem = reply.tool_input_errors.get("toolu_scripted_t")
    if stop_reason == "max_tokens":
        assert problem is not None  # cut off inside the call: never run, whatever parsed
    elif not isinstance(raw, str | None):  # null: no arguments in that delta
        assert problem is not None and block["input"] == {}
    elif problem is None:
        assert block["input"] == (orjson.loads(raw) if raw and raw.strip() else {})
        assert isinstance(block["input"], dict)


@pytest.mark.parametrize(
    "url", ["localhost:8080/v1", "ftp://example.com", "http://", "http://[::1", "http://h:99999"]
)
async def test_a_base_url_that_is_not_http_is_a_configuration_error_before_any_request(url: str) -> None:
    llm = OpenAICompatibleLLM(base_url=url, env={})
    with pytest.raises(LLMConfigurationError, match="is not an http:// or https:// URL"):
        await ask(llm)
    assert key_required(url) is False  # never an error of its own


async def test_a_streamed_reply_leaves_no_generator_for_the_garbage_collector_to_close(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    # Each generator of the stream left open is closed by asyncio's finaliser hook instead: a wake-up of
    # the event loop through its self-pipe and a task, for every reply (six a reply before). httpx's own
    # (aiter_raw inside its aiter_bytes) is not ours to close.
    server.enqueue(ScriptedTurn.text("first", chunks=3))
    await ask(llm)  # the connection and the client warmed up
    hooks = sys.get_asyncgen_hooks()
    finalised: list[str] = []

    def finalizer(generator: Any) -> None:
        if "agentlife" in generator.ag_code.co_filename:
            finalised.append(generator.__qualname__)
        assert hooks.finalizer is not None
        hooks.finalizer(generator)

    sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=finalizer)
    try:
        server.enqueue(ScriptedTurn.text("Labelled as a bug.", chunks=4))
        reply = await ask(llm)
        gc.collect()
    finally:
        sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=hooks.finalizer)
    assert reply.text == "Labelled as a bug."
    assert finalised == []
