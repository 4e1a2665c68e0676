"""A real MCP server for the tests, over stdio (plain JSON-RPC, or the SDK's low-level ``Server``) or HTTP.

``python tests/mcp_test_server.py STATE_DIR [--http PORT | --sdk] [--variant N] [--invalid-schema]
[--name NAME]``

Over stdio the server speaks newline-delimited JSON-RPC itself (asyncio, no SDK import: it starts in a few
tens of milliseconds instead of half a second, which is most of what an MCP test costs); ``--sdk`` serves the
same tools through the SDK's ``Server`` over stdio, ``--http PORT`` over Streamable HTTP. Either way the
client side is the real SDK, and the tools behave the same (one table, ``tool_list`` and ``handle``):

``lookup`` (read-only), ``create_issue`` (destructive: appends to ``STATE_DIR/effects.jsonl`` with the
invocation id it got in ``_meta``; sleeps ``STATE_DIR/create_sleep`` seconds before the effect and
``STATE_DIR/create_delay`` seconds after it when those files exist), ``slow`` (read-only sleep), ``crash``
(the process exits mid-call), ``hang``, ``malformed`` (a structured result that breaks its own output
schema), ``big`` (a text result of N MB), ``set_flag`` (idempotent), ``whoami`` (read-only: the
``Authorization`` and ``X-Api-Key`` headers it got, over HTTP), ``quit`` (answers, then the process exits
while idle), ``mangled`` (destructive: the effect, then an answer whose text is a lone surrogate escape,
which the SDK's parser refuses) and ``stamp`` (destructive; its schema has a required ``invocation_id``).
``shapeless`` (read-only) answers with a result that is not an object. ``--variant 2`` changes
``create_issue``'s schema, ``--variant 3`` its description (the tool list changed between attempts).
The server writes its pid to ``STATE_DIR/pid`` (one line per start) and each call to ``calls.jsonl``; it
exits at once, without answering, while ``STATE_DIR/refuse_start`` exists.

``--stubborn`` (stdio): the server ignores SIGTERM and the end of its input, and starts a child in its
process group that does the same (its pid in ``STATE_DIR/child_pid``): only SIGKILL ends them.

``--grandchild`` (stdio): the server starts a child in its process group that outlives it unless killed
(its pid in ``STATE_DIR/grandchild_pid``); the server itself exits at the end of its input, as SDK servers do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ISSUE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"title": {"type": "string", "minLength": 1}, "body": {"type": "string"}},
    "required": ["title"],
    "additionalProperties": False,
}
READ_ONLY = {"readOnlyHint": True}


def tool_list(variant: int, invalid_schema: bool) -> list[dict[str, Any]]:
    """The tools, as the wire format lists them."""
    issue = json.loads(json.dumps(ISSUE_SCHEMA))
    if variant == 2:
        issue["properties"]["labels"] = {"type": "array", "items": {"type": "string"}}
        issue["required"] = ["title", "labels"]
    described = "Create an issue in the new tracker." if variant == 3 else "Create an issue."
    key = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
    tools: list[dict[str, Any]] = [
        {
            "name": "lookup",
            "description": "Look an issue up by its key.",
            "inputSchema": key,
            "annotations": READ_ONLY,
        },
        {
            "name": "create_issue",
            "description": described,
            "inputSchema": issue,
            "annotations": {"destructiveHint": True},
        },
        {
            "name": "slow",
            "description": "Sleep, then answer.",
            "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}},
            "annotations": READ_ONLY,
        },
        {"name": "crash", "description": "Exit mid-call.", "inputSchema": {"type": "object"}},
        {
            "name": "hang",
            "description": "Never answer.",
            "inputSchema": {"type": "object"},
            "annotations": READ_ONLY,
        },
        {
            "name": "malformed",
            "description": "A result that breaks its output schema.",
            "inputSchema": {"type": "object"},
            "outputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            "annotations": READ_ONLY,
        },
        {
            "name": "big",
            "description": "A large text result.",
            "inputSchema": {"type": "object", "properties": {"mb": {"type": "number"}}, "required": ["mb"]},
            "annotations": READ_ONLY,
        },
        {
            "name": "whoami",
            "description": "The credentials the request came with.",
            "inputSchema": {"type": "object"},
            "annotations": READ_ONLY,
        },
        {
            "name": "quit",
            "description": "Answer, then exit.",
            "inputSchema": {"type": "object"},
            "annotations": READ_ONLY,
        },
        {
            "name": "mangled",
            "description": "Do the effect, then answer with a lone surrogate escape.",
            "inputSchema": {"type": "object", "properties": {"title": {"type": "string"}}},
            "annotations": {"destructiveHint": True},
        },
        {
            "name": "stamp",
            "description": "Stamp a document, keyed by the invocation id.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "doc": {"type": "string"},
                    "invocation_id": {"type": "string", "minLength": 1},
                },
                "required": ["doc", "invocation_id"],
                "additionalProperties": False,
            },
            "annotations": {"destructiveHint": True},
        },
        {
            "name": "shapeless",
            "description": "An answer that is not a result.",
            "inputSchema": {"type": "object"},
            "annotations": READ_ONLY,
        },
        {
            "name": "set_flag",
            "description": "Set a flag (idempotent).",
            "inputSchema": {
                "type": "object",
                "properties": {"flag": {"type": "string"}},
                "required": ["flag"],
            },
            "annotations": {"idempotentHint": True},
        },
    ]
    if invalid_schema:
        tools.append(
            {
                "name": "broken",
                "description": "Its schema is not JSON Schema.",
                "inputSchema": {"type": "object", "properties": {"x": {"type": 12}}},
            }
        )
    return tools


def text(value: str, **more: Any) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}], **more}


def effect(state: Path, record: dict[str, Any]) -> None:
    with (state / "effects.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


async def handle(
    state: Path,
    tool: str,
    args: dict[str, Any],
    meta: dict[str, Any],
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One ``tools/call``: the result in the wire format."""
    with (state / "calls.jsonl").open("a") as f:
        f.write(json.dumps({"tool": tool, "args": args, "meta": meta}) + "\n")
    effects = state / "effects.jsonl"
    if tool == "lookup":
        lines = effects.read_text().splitlines() if effects.exists() else []
        found = [json.loads(line) for line in lines if json.loads(line)["key"] == args["key"]]
        return text(json.dumps(found[0]) if found else "none")
    if tool == "create_issue":
        sleep = state / "create_sleep"
        if sleep.exists():  # the client may be gone by the end of it: the effect happens all the same
            await asyncio.sleep(float(sleep.read_text()))
        effect(
            state, {"key": meta.get("agentlife/invocation_id"), "title": args["title"], "pid": os.getpid()}
        )
        delay = state / "create_delay"
        if delay.exists():
            await asyncio.sleep(float(delay.read_text()))
        return text(f"created {args['title']}", structuredContent={"created": args["title"]})
    if tool == "slow":
        await asyncio.sleep(float(args.get("seconds", 1)))
        return text("slept")
    if tool == "crash":
        os._exit(3)
    if tool == "hang":
        await asyncio.sleep(3600)
    if tool == "malformed":
        return text("{}", structuredContent={"n": "not a number"})
    if tool == "big":
        return text("x" * int(float(args["mb"]) * 1024 * 1024))
    if tool == "set_flag":
        return text(f"flag {args['flag']} set")
    if tool == "whoami":
        wanted = ("authorization", "x-api-key")
        return text(json.dumps({k: v for k, v in (headers or {}).items() if k.lower() in wanted}))
    if tool == "quit":
        asyncio.get_running_loop().call_later(0.05, os._exit, 0)
        return text("bye")
    if tool == "mangled":
        effect(
            state,
            {"key": meta.get("agentlife/invocation_id"), "title": args.get("title"), "pid": os.getpid()},
        )
        return text("done \ud800")  # json.dumps writes it as the escape \ud800
    if tool == "shapeless":
        return 5  # type: ignore[return-value]  # deliberately not a result object
    if tool == "stamp":
        effect(state, {"key": args["invocation_id"], "title": args["doc"], "pid": os.getpid()})
        return text(f"stamped {args['doc']}")
    return text("no such tool", isError=True)


# -- plain JSON-RPC over stdio ----------------------------------------------------------------------------


async def serve_stdio(state: Path, tools: list[dict[str, Any]], name: str, stubborn: bool) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 30)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    running: dict[Any, asyncio.Task[None]] = {}

    def send(message: dict[str, Any]) -> None:
        sys.stdout.buffer.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        sys.stdout.buffer.flush()

    async def answer(request: dict[str, Any]) -> None:
        method, params = request.get("method"), request.get("params") or {}
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": params.get("protocolVersion"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": name, "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": tools}
        elif method == "tools/call":
            args, meta = params.get("arguments") or {}, params.get("_meta") or {}
            result = await handle(state, params["name"], args, meta)
        elif method == "ping":
            result = {}
        else:
            send({"id": request["id"], "error": {"code": -32601, "message": f"no method {method}"}})
            return
        send({"id": request["id"], "result": result})
        running.pop(request["id"], None)

    while line := await reader.readline():
        message = json.loads(line)
        if "id" in message and "method" in message:
            running[message["id"]] = asyncio.ensure_future(answer(message))
        elif message.get("method") == "notifications/cancelled":
            task = running.pop((message.get("params") or {}).get("requestId"), None)
            if task is not None:
                task.cancel()
    if stubborn:
        await asyncio.sleep(3600)
    os._exit(0)  # stdin closed: the client is gone (what SDK servers do too)


def start_grandchild(state: Path) -> None:
    """A child in this server's process group, that lives until it is killed."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(3600)"]
    quiet = subprocess.DEVNULL
    child = subprocess.Popen(sleeper, stdin=quiet, stdout=quiet, stderr=quiet)
    (state / "grandchild_pid").write_text(str(child.pid))


def become_stubborn(state: Path) -> None:
    """Ignore SIGTERM, with a child in the same process group that ignores it too and never reads input."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sleeper = [sys.executable, "-c", "import time; time.sleep(3600)"]
    # SIG_IGN is inherited across exec; the child's stdin is not the server's, so no end of input reaches it.
    quiet = subprocess.DEVNULL
    child = subprocess.Popen(sleeper, stdin=quiet, stdout=quiet, stderr=quiet)
    (state / "child_pid").write_text(str(child.pid))


# -- the SDK's server -----------------------------------------------------------------------------------


def sdk_server(state: Path, tools: list[dict[str, Any]], name: str) -> Any:
    import mcp.types as types
    from mcp.server.lowlevel import Server

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool.model_validate(t) for t in tools])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments, meta = dict(params.arguments or {}), dict(ctx.meta or {})
        headers = getattr(ctx.request, "headers", None)  # the HTTP request (Starlette's), None over stdio
        result = await handle(state, params.name, arguments, meta, headers)
        return types.CallToolResult.model_validate(result)

    return Server(name, on_list_tools=list_tools, on_call_tool=call_tool)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("state", type=Path)
    parser.add_argument("--http", type=int, default=None)
    parser.add_argument("--sdk", action="store_true")
    parser.add_argument("--variant", type=int, default=1)
    parser.add_argument("--invalid-schema", action="store_true")
    parser.add_argument("--name", default="tracker")
    parser.add_argument("--stubborn", action="store_true")
    parser.add_argument("--grandchild", action="store_true")
    options = parser.parse_args()
    options.state.mkdir(parents=True, exist_ok=True)
    if (options.state / "refuse_start").exists():
        sys.exit("refusing to start")
    with (options.state / "pid").open("a") as f:
        f.write(f"{os.getpid()} {time.time()}\n")
    tools = tool_list(options.variant, options.invalid_schema)
    if options.stubborn:
        become_stubborn(options.state)
    if options.grandchild:
        start_grandchild(options.state)
    if options.http is None and not options.sdk:
        asyncio.run(serve_stdio(options.state, tools, options.name, options.stubborn))
        return
    import anyio

    server = sdk_server(options.state, tools, options.name)
    if options.http is None:
        from mcp.server.stdio import stdio_server

        async def run_stdio() -> None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(run_stdio)
        return
    import uvicorn

    app = server.streamable_http_app(json_response=True)
    uvicorn.run(app, host="127.0.0.1", port=options.http, log_level="warning")


if __name__ == "__main__":
    sys.exit(main())
