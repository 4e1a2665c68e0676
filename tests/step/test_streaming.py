"""``ctx.llm.stream``: the same journaled call as ``complete``, its text handed on as it arrives.

Most tests stream a `ScriptedLLM` (the real adapter's stream guard and assembler over scripted events)
through a `StepContext` on a real journal; the runs that need the whole process around the step (a
crash and a resume, a drain) use `AgentHarness`; two stream `AnthropicLLM` from `FakeAnthropicServer` over
HTTP, each over every transport: agentlife's loopback client, httpx and a real ``anthropic.AsyncAnthropic``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from _net import PROXY_VARIABLES, non_loopback_address
from agentlife import (
    AgentProcess,
    AnthropicLLM,
    Done,
    LLMClient,
    LLMReply,
    LLMTimeout,
    PermanentError,
    ScriptedLLM,
    ScriptedTurn,
    StepContext,
    StreamEvent,
    StreamTimeouts,
    Usage,
    tool,
)
from agentlife._llm._anthropic import anthropic_stream_event, collect_reply
from agentlife._llm._openai_format import chat_stream_event
from agentlife._replay import llm_request_digest
from agentlife._runtime._lifecycle import Runtime
from agentlife.testing import AgentHarness, FakeAnthropicServer
from stepctx import MakeCtx, journal_events, step_contexts

pytestmark = pytest.mark.anyio

MODEL = "claude-sonnet-agentlife-test"
KEY = "sk-ant-api03-streaming-secret-0123456789"
MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
async def make_ctx(tmp_path: Path) -> AsyncIterator[MakeCtx]:
    async with step_contexts(tmp_path) as make:
        yield make


@tool(side_effects=False)
async def lookup(word: str) -> str:
    """Look a word up."""
    return word


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


# --- streaming a live call ----------------------------------------------------------------------------


async def test_text_deltas_arrive_in_order_before_the_reply_completes(make_ctx: MakeCtx) -> None:
    llm = ScriptedLLM([ScriptedTurn.text("Hello there, streaming world!", chunks=5, delay=0.001)])
    ctx, journal = await make_ctx(llm)
    seen: list[tuple[str, bool]] = []
    async with ctx.llm.stream(model=MODEL, messages=MESSAGES, max_tokens=64) as s:
        async for text in s.text_stream:
            # Whether the reply was complete when this delta reached the block.
            seen.append((text, s.reply is not None))
        reply = await s.get_final_reply()
    assert len(seen) == 5
    assert not any(done for _, done in seen[:-1])  # they came before the reply was complete
    assert reply.text == "Hello there, streaming world!" and s.reply is reply
    assert "".join(text for text, _ in seen) == reply.text
    assert llm.calls == 1
    assert "on_event" not in llm.requests[0].params  # handed to the adapter, never a request parameter
    events = await journal_events(journal)
    assert _types(events).count("LLM_STARTED") == 1 and _types(events).count("LLM_COMPLETED") == 1


async def test_thinking_deltas_come_apart_from_the_text(make_ctx: MakeCtx) -> None:
    turn = ScriptedTurn.thinking("First, the facts. Then the answer.", "It is 42.", chunks=3)
    ctx, _ = await make_ctx(ScriptedLLM([turn, turn]))
    async with ctx.llm.stream(model=MODEL, messages=MESSAGES, max_tokens=64) as s:
        thinking = [t async for t in s.thinking_stream]
    assert "".join(thinking) == "First, the facts. Then the answer." and len(thinking) == 3
    assert s.reply is not None and s.reply.text == "It is 42."  # text deltas skipped, reply complete

    async with ctx.llm.stream(model=MODEL, messages=MESSAGES, max_tokens=64) as s:
        events = [event async for event in s]
    kinds = [e.kind for e in events]
    assert kinds.index("thinking") < kinds.index("text")
    assert "".join(e.text for e in events if e.kind == "text") == "It is 42."
    assert events[0].raw["type"] == "message_start" and events[-1].raw["type"] == "message_stop"
    assert all(e.text == "" for e in events if e.kind == "other")


async def test_the_stream_is_the_call_complete_would_make_journaled_once_with_its_digest(
    make_ctx: MakeCtx,
) -> None:
    params: dict[str, Any] = {"system": "Be brief.", "temperature": 0.2, "tools": [lookup]}
    llm = ScriptedLLM([ScriptedTurn.text("streamed", chunks=2), ScriptedTurn.text("completed")])
    ctx, journal = await make_ctx(llm)
    async with ctx.llm.stream(model=MODEL, messages=MESSAGES, max_tokens=64, **dict(params)) as s:
        streamed = await s.get_final_reply()
    completed = await ctx.llm.complete(model=MODEL, messages=MESSAGES, max_tokens=64, **dict(params))
    assert (streamed.text, completed.text) == ("streamed", "completed")
    # Both requests reached the adapter identically (tool functions as their definitions).
    assert llm.requests[0].params == llm.requests[1].params
    assert llm.requests[0].params["tools"][0]["name"] == "lookup"
    events = await journal_events(journal)
    done = [e for e in events if e["type"] == "LLM_COMPLETED"]
    assert [e["call"] for e in done] == [0, 1]
    assert done[0]["digest"] == done[1]["digest"]
    expected = {**params, "tools": [lookup.definition]}
    assert done[0]["digest"] == llm_request_digest(MODEL, MESSAGES, 64, expected)
    assert done[0]["response"]["text"] == "streamed"


async def test_an_adapter_that_does_not_stream_events_is_streamed_whole(make_ctx: MakeCtx) -> None:
    class Whole:
        """An LLMClient without ``streams_events``: ``complete`` takes no ``on_event``."""

        def __init__(self) -> None:
            self.inner = ScriptedLLM([ScriptedTurn.thinking("Hmm.", "Whole reply.", chunks=2)])

        async def complete(
            self,
            *,
            model: str,
            messages: Sequence[Mapping[str, Any]],
            max_tokens: int,
            timeouts: StreamTimeouts | None = None,
            **params: Any,
        ) -> LLMReply:
            assert "on_event" not in params
            return await self.inner.complete(
                model=model, messages=messages, max_tokens=max_tokens, timeouts=timeouts, **params
            )

        async def aclose(self) -> None:
            pass

    ctx, _ = await make_ctx(Whole())
    async with ctx.llm.stream(model=MODEL, messages=MESSAGES, max_tokens=64) as s:
        events = [event async for event in s]
    assert [(e.kind, e.text) for e in events] == [("thinking", "Hmm."), ("text", "Whole reply.")]
    assert {e.raw["source"] for e in events} == {"reply"}


async def test_a_retry_mid_stream_sends_a_marker_and_the_text_starts_over(make_ctx: MakeCtx) -> None:
    # Inter-chunk timeout 5 s -> 0.05 s: the first try stalls after two deltas and is retried.
    llm = ScriptedLLM(
        [ScriptedTurn.stall("Never finished", after_chunks=2, chunks=3), ScriptedTurn.text("Fine.", chunks=2)]
    )
    ctx, journal = await make_ctx(llm, AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS="5")
    async with ctx.llm.stream(model=MODEL, messages=MESSAGES, max_tokens=64) as s:
        events = [event async for event in s]
    [marker] = [i for i, e in enumerate(events) if e.raw.get("type") == "agentlife_retry"]
    assert [e.text for e in events[:marker] if e.kind == "text"] == ["Never", " fini"]  # the stalled try
    assert [e.text for e in events[marker:] if e.kind == "text"] == ["Fin", "e."]  # from its first delta
    retry = events[marker]
    assert retry.kind == "other" and retry.raw["attempt"] == 1 and retry.raw["error_type"] == "LLMTimeout"
    assert s.reply is not None and s.reply.text == "Fine." and llm.calls == 2
    journaled = await journal_events(journal)
    assert _types(journaled).count("RETRY") == 1 and _types(journaled).count("LLM_COMPLETED") == 1


async def test_a_stall_that_outlasts_the_retries_raises_llm_timeout_from_the_iteration(
    make_ctx: MakeCtx,
) -> None:
    # Inter-chunk 5 s -> 0.05 s; total 10 s -> 0.1 s, so the step budget (the longer of the 45 s drain
    # step deadline and the total timeout) is 0.45 s: a few retries, then the error.
    llm = ScriptedLLM([ScriptedTurn.stall(after_chunks=1)], cycle=True)
    ctx, journal = await make_ctx(
        llm, AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS="5", AGENTLIFE_LLM_TOTAL_TIMEOUT_SECONDS="10"
    )
    texts: list[str] = []
    raised: list[LLMTimeout] = []
    async with ctx.llm.stream(model=MODEL, messages=MESSAGES, max_tokens=64) as s:
        try:
            async for text in s.text_stream:
                texts.append(text)
        except LLMTimeout as exc:  # from the iteration itself, not only when the block ends
            raised.append(exc)
    assert [exc.kind for exc in raised] == ["chunk"]
    assert llm.calls >= 2 and len(texts) == llm.calls  # one delta per try, each try started over
    assert s.reply is None
    with pytest.raises(LLMTimeout):
        await s.get_final_reply()
    journaled = await journal_events(journal)
    assert "LLM_COMPLETED" not in _types(journaled)
    assert _types(journaled).count("RETRY") == llm.calls - 1


async def test_an_error_nobody_read_is_raised_when_the_block_ends(make_ctx: MakeCtx) -> None:
    llm = ScriptedLLM([ScriptedTurn.http_error(400, message="messages: field required")])
    ctx, _ = await make_ctx(llm)

    async def wait_unread() -> None:
        async with ctx.llm.stream(model=MODEL, messages=MESSAGES, max_tokens=64) as s:
            with anyio.fail_after(5):
                while not llm.calls:  # the 400 is raised, and kept, in the step that counts the call
                    await anyio.sleep(0.001)
            assert s.reply is None

    with pytest.raises(PermanentError, match="field required"):
        await wait_unread()


async def test_leaving_the_block_early_cancels_the_call_and_the_next_call_goes_on(make_ctx: MakeCtx) -> None:
    llm = ScriptedLLM([ScriptedTurn.stall("one two three", after_chunks=2, chunks=3), "next"])
    ctx, journal = await make_ctx(llm, AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS="60000")
    async with ctx.llm.stream(model=MODEL, messages=MESSAGES, max_tokens=64) as s:
        async for text in s.text_stream:
            first = text
            break
    assert first and "one two three".startswith(first) and s.reply is None
    with pytest.raises(RuntimeError, match="left before its reply completed"):
        await s.get_final_reply()
    with pytest.raises(RuntimeError, match="inside its block"):
        ctx.llm.stream(model=MODEL, messages=MESSAGES, max_tokens=64).text_stream  # noqa: B018
    nxt = await ctx.llm.complete(model=MODEL, messages=MESSAGES, max_tokens=64)
    assert nxt.text == "next"
    journaled = await journal_events(journal)
    assert [(e["type"], e["call"]) for e in journaled if e["type"].startswith("LLM_")] == [
        ("LLM_STARTED", 0),
        ("LLM_STARTED", 1),
        ("LLM_COMPLETED", 1),
    ]


# --- the hand-off between the call's task and the block -------------------------------------------------


class PerPass:
    """An adapter whose stream suspends once per event, like network I/O that always has the next one ready.

    The real loop (`collect_reply`: the stream guard and the assembler) over ``deltas`` text deltas;
    ``stall`` leaves it silent after them instead of ending the message. ``closed`` tells whether the
    source was closed.
    """

    streams_events = True

    def __init__(self, deltas: int, *, stall: bool = False) -> None:
        self.deltas = deltas
        self.stall = stall
        self.closed = False

    async def _events(self) -> AsyncIterator[Mapping[str, Any]]:
        try:
            start = {
                "id": "m",
                "model": MODEL,
                "content": [],
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }
            yield {"type": "message_start", "message": start}
            yield {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
            for i in range(self.deltas):
                await anyio.sleep(0)
                yield {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": f"{i} "},
                }
            if self.stall:
                await anyio.sleep_forever()
            yield {"type": "content_block_stop", "index": 0}
            yield {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 9},
            }
            yield {"type": "message_stop"}
        finally:
            self.closed = True

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        timeouts: StreamTimeouts | None = None,
        on_event: Any = None,
        **params: Any,
    ) -> LLMReply:
        assert timeouts is not None
        return await collect_reply(self._events(), timeouts, model=model, on_event=on_event)

    async def aclose(self) -> None:
        pass


async def test_a_call_that_hands_on_an_event_per_loop_pass_is_read_in_order_without_waiting(
    make_ctx: MakeCtx,
) -> None:
    ctx, journal = await make_ctx(PerPass(300))
    async with ctx.llm.stream(model=MODEL, messages=MESSAGES, max_tokens=64) as s:
        texts = [text async for text in s.text_stream]
        reply = await s.get_final_reply()
    assert texts == [f"{i} " for i in range(300)] and reply.text == "".join(texts)
    # Each delta was in the queue after one pass of the loop: the reader parked on a future at most
    # before the first one, not once per delta.
    assert s._waits <= 2
    assert _types(await journal_events(journal)).count("LLM_COMPLETED") == 1


async def test_a_reader_of_a_paced_call_gets_every_delta_and_parks_while_the_call_is_silent(
    make_ctx: MakeCtx,
) -> None:
    paced = ScriptedTurn.text("".join(f"{i:02d} " for i in range(40)), chunks=40, delay=0.002)
    stalled = ScriptedTurn.stall("one two three", after_chunks=2, chunks=3)
    ctx, journal = await make_ctx(
        ScriptedLLM([paced, stalled]), AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS="60000"
    )
    async with ctx.llm.stream(model=MODEL, messages=MESSAGES, max_tokens=64) as s:
        texts = [text async for text in s.text_stream]
    assert len(texts) == 40 and "".join(texts) == "".join(f"{i:02d} " for i in range(40))
    assert s.reply is not None and s.reply.text == "".join(texts)

    silent: list[str] = []

    async def watch(stream: Any, scope: anyio.CancelScope) -> None:
        with anyio.fail_after(10):
            while len(silent) < 2 or stream._waiter is None:  # read both deltas, waiting for a third
                await anyio.sleep(0.001)
        waiter = stream._waiter
        for _ in range(20):  # a reader passing the loop over and over would drop or replace its future
            await anyio.sleep(0.002)
            assert stream._waiter is waiter and not waiter.done()
        scope.cancel()

    async with anyio.create_task_group() as tg:
        with anyio.CancelScope() as scope:
            async with ctx.llm.stream(model=MODEL, messages=MESSAGES, max_tokens=64) as s:
                tg.start_soon(watch, s, scope)
                async for text in s.text_stream:
                    silent.append(text)
    assert scope.cancelled_caught
    assert len(silent) == 2 and "one two three".startswith("".join(silent))
    assert s.reply is None
    types = _types(await journal_events(journal))
    assert types.count("LLM_STARTED") == 2 and types.count("LLM_COMPLETED") == 1


async def test_an_enclosing_cancel_scope_stops_the_reader_mid_stream_and_cancels_the_call(
    make_ctx: MakeCtx,
) -> None:
    llm = PerPass(1000, stall=True)
    ctx, journal = await make_ctx(llm, AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS="60000")
    texts: list[str] = []
    with anyio.CancelScope() as scope:
        async with ctx.llm.stream(model=MODEL, messages=MESSAGES, max_tokens=64) as s:
            async for text in s.text_stream:
                texts.append(text)
                if len(texts) == 10:
                    scope.cancel()  # delivered where the reader next waits for a delta
    assert scope.cancelled_caught
    assert texts[:10] == [f"{i} " for i in range(10)] and len(texts) < 1000
    assert s.reply is None and llm.closed  # the guard closed the source
    with pytest.raises(RuntimeError, match="left before its reply completed"):
        await s.get_final_reply()
    types = _types(await journal_events(journal))
    assert "LLM_STARTED" in types and "LLM_COMPLETED" not in types


def test_the_events_adapters_build_are_ordinary_stream_events() -> None:
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}}
    chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}}]}
    built = [
        anthropic_stream_event(delta),
        chat_stream_event(chunk),
        anthropic_stream_event({"type": "ping"}),
    ]
    expected = [
        StreamEvent("thinking", "hm", delta),
        StreamEvent("text", "hi", chunk),
        StreamEvent("other", "", {"type": "ping"}),
    ]
    assert built == expected and [repr(e) for e in built] == [repr(e) for e in expected]
    assert all(type(e) is StreamEvent for e in built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built[0].text = "changed"  # type: ignore[misc]
    assert dataclasses.replace(built[1], text="ho") == StreamEvent("text", "ho", chunk)
    assert dataclasses.asdict(built[0]) == {"kind": "thinking", "text": "hm", "raw": delta}


# --- the whole process: crash and replay, drain, the real SDK -----------------------------------------


class Streamer(AgentProcess):
    """One streamed call; records what the block saw. ``crash`` fails the step after the call."""

    agent_id = "streamer"

    def __init__(self, llm: LLMClient, *, crash: bool = False, on_first_text: Any = None) -> None:
        self.llm = llm
        self.crash = crash
        self.on_first_text = on_first_text
        self.events: list[StreamEvent] = []
        self.before_completion: list[bool] = []

    def make_llm(self) -> LLMClient:
        return self.llm

    async def step(self, ctx: StepContext) -> Done | None:
        async with ctx.llm.stream(model=MODEL, max_tokens=64, messages=MESSAGES) as s:
            async for event in s:
                first = event.kind == "text" and not any(e.kind == "text" for e in self.events)
                if first and self.on_first_text is not None:
                    self.on_first_text()
                self.events.append(event)
            reply = await s.get_final_reply()
        if self.crash:
            raise RuntimeError("the process dies after the call")
        return Done(result={"text": reply.text})


async def test_a_resumed_step_streams_the_recorded_reply_without_asking_the_model(
    agent_harness: AgentHarness,
) -> None:
    turn = ScriptedTurn.thinking("Think.", "Recorded answer.", chunks=3)
    first = ScriptedLLM([turn])
    crashed = await agent_harness.run(Streamer(first, crash=True))
    assert crashed.exit_code == 1 and first.calls == 1
    assert crashed.job is not None and crashed.job.status == "RUNNING"
    [recorded] = [e for e in crashed.journal if e["type"] == "LLM_COMPLETED"]

    again = ScriptedLLM([])  # any request would raise ScriptExhausted
    agent = Streamer(again)
    resumed = await agent_harness.run(agent)
    assert resumed.exit_code == 0 and again.calls == 0
    assert resumed.job is not None and resumed.job.result == {"text": "Recorded answer."}
    assert [(e.kind, e.text) for e in agent.events] == [("thinking", "Think."), ("text", "Recorded answer.")]
    assert {e.raw["source"] for e in agent.events} == {"journal"}
    # Replayed: the resumed session journaled no call of its own (only what it carried forward).
    assert resumed.journal_types().count("LLM_STARTED") == 1
    assert resumed.journal_types().count("LLM_COMPLETED") == 1
    assert recorded["response"]["text"] == "Recorded answer."


async def test_a_drain_during_a_stream_cancels_the_step_like_complete(agent_harness: AgentHarness) -> None:
    runtimes: list[Runtime] = []

    def keep(runtime: Runtime, event: str, info: dict[str, Any]) -> None:
        if not runtimes:
            runtimes.append(runtime)

    llm = ScriptedLLM([ScriptedTurn.stall("never ends", after_chunks=1)])
    agent = Streamer(llm, on_first_text=lambda: runtimes[0].request_drain("SIGTERM"))
    run = await agent_harness.run(
        agent, on_event=keep, env={"AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS": "60000"}
    )
    assert run.exit_code == 143
    [text] = [e.text for e in agent.events if e.kind == "text"]
    assert "never ends".startswith(text)
    assert run.job is not None and run.job.status == "RUNNING"  # resumable
    types = run.journal_types()
    assert "DRAIN_STARTED" in types and "LLM_STARTED" in types and "LLM_COMPLETED" not in types


class Transport:
    """Where a test's `FakeAnthropicServer` listens (``host``), and the `AnthropicLLM` that reaches it."""

    def __init__(self, name: str, host: str) -> None:
        self.name, self.host = name, host
        self.sdks: list[Any] = []

    def __call__(self, base_url: str) -> AnthropicLLM:
        if self.name != "sdk":
            return AnthropicLLM(api_key=KEY, base_url=base_url)
        import anthropic

        self.sdks.append(anthropic.AsyncAnthropic(api_key=KEY, base_url=base_url))
        return AnthropicLLM(client=self.sdks[-1])


@pytest.fixture(params=["loopback", "httpx", "sdk"])
async def anthropic_llm(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Any]:
    """The default client on 127.0.0.1 (agentlife's loopback client), on this machine's other address
    (httpx, as a remote server is reached), or a real ``anthropic.AsyncAnthropic`` (closed after)."""
    host = "127.0.0.1"
    if request.param == "httpx":
        host = non_loopback_address()
        for variable in PROXY_VARIABLES:
            monkeypatch.delenv(variable, raising=False)
    transport = Transport(request.param, host)
    yield transport
    for sdk in transport.sdks:
        await sdk.close()


async def test_a_real_stream_hands_deltas_on_before_the_server_finished_sending(
    tmp_path: Path, anthropic_llm: Any
) -> None:
    turn = ScriptedTurn.reply(
        [
            {"type": "thinking", "thinking": "Weighing it.", "signature": "c2ln"},
            {"type": "text", "text": "Four words, streamed slowly."},
        ],
        chunks=4,
        delay=0.02,
        usage=Usage(input_tokens=10, output_tokens=8),
    )
    async with FakeAnthropicServer([turn], api_key=KEY, host=anthropic_llm.host) as server:
        seen_completed: list[int] = []
        agent = Streamer(
            anthropic_llm(server.base_url),
            on_first_text=lambda: seen_completed.append(server.completed),
        )
        run = await AgentHarness(tmp_path / "a").run(agent)
    assert run.exit_code == 0, run.log_messages()
    assert seen_completed == [0]  # the first text delta arrived while the server was still sending
    texts = [e.text for e in agent.events if e.kind == "text"]
    assert len(texts) == 4 and "".join(texts) == "Four words, streamed slowly."
    assert "".join(e.text for e in agent.events if e.kind == "thinking") == "Weighing it."
    assert run.job is not None and run.job.result == {"text": "Four words, streamed slowly."}
    assert len(server.requests) == 1 and "on_event" not in server.requests[0].body
    assert server.requests[0].headers.get("x-agentlife-invocation") == "job-1/0/0"


async def test_leaving_a_real_stream_early_closes_the_connection(tmp_path: Path, anthropic_llm: Any) -> None:
    class Quitter(AgentProcess):
        agent_id = "quitter"

        def __init__(self, llm: LLMClient) -> None:
            self.llm = llm
            self.first = ""

        def make_llm(self) -> LLMClient:
            return self.llm

        async def step(self, ctx: StepContext) -> Done | None:
            async with ctx.llm.stream(model=MODEL, max_tokens=64, messages=MESSAGES) as s:
                async for text in s.text_stream:
                    self.first = text
                    break
            return Done(result={"reply": s.reply is not None})

    stall = ScriptedTurn.stall("a b c d", after_chunks=2)
    async with FakeAnthropicServer([stall], api_key=KEY, host=anthropic_llm.host) as server:
        agent = Quitter(anthropic_llm(server.base_url))
        run = await AgentHarness(tmp_path / "a").run(
            agent, env={"AGENTLIFE_LLM_INTER_CHUNK_TIMEOUT_SECONDS": "60000"}
        )
        await server.wait_for_disconnects(1)  # the client hung up on the stalled response
    assert run.exit_code == 0 and agent.first and "a b c d".startswith(agent.first)
    assert run.job is not None and run.job.result == {"reply": False}
    assert server.disconnected_requests == (0,) and len(server.requests) == 1
    assert "LLM_COMPLETED" not in run.journal_types()


class Completer(AgentProcess):
    """The same request as `Streamer`, made with ``complete``; the process dies after it."""

    agent_id = "streamer"

    def __init__(self, llm: LLMClient) -> None:
        self.llm = llm

    def make_llm(self) -> LLMClient:
        return self.llm

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.llm.complete(model=MODEL, max_tokens=64, messages=MESSAGES)
        raise RuntimeError("the process dies after the call")


async def test_a_call_completed_before_a_crash_replays_into_a_stream(agent_harness: AgentHarness) -> None:
    first = ScriptedLLM(["Said with complete()."])
    crashed = await agent_harness.run(Completer(first))
    assert crashed.exit_code == 1 and first.calls == 1

    again = ScriptedLLM([])
    agent = Streamer(again)
    resumed = await agent_harness.run(agent)
    assert resumed.exit_code == 0 and again.calls == 0  # same call number, same digest: replayed
    assert [(e.kind, e.text) for e in agent.events] == [("text", "Said with complete().")]
