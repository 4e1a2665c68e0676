"""A real MCP server for the tests, on the official SDK's low-level ``Server``: stdio or Streamable HTTP.

``python tests/mcp_test_server.py STATE_DIR [--http PORT] [--variant N] [--invalid-schema] [--name NAME]``

Tools: ``lookup`` (read-only), ``create_issue`` (destructive: appends to ``STATE_DIR/effects.jsonl`` with the
invocation id it got in ``_meta``; waits ``STATE_DIR/create_delay`` seconds after the effect when that file
exists), ``slow`` (read-only sleep), ``crash`` (the process exits mid-call), ``hang``, ``malformed`` (a
structured result that breaks its own output schema), ``big`` (a text result of N MB) and ``set_flag``
(idempotent). ``--variant 2`` changes ``create_issue``'s schema (the tool list changed between attempts).
The server writes its pid to ``STATE_DIR/pid`` (one line per start) and each call to ``calls.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server

ISSUE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"title": {"type": "string", "minLength": 1}, "body": {"type": "string"}},
    "required": ["title"],
    "additionalProperties": False,
}


def tool_list(variant: int, invalid_schema: bool) -> list[types.Tool]:
    issue = json.loads(json.dumps(ISSUE_SCHEMA))
    if variant == 2:
        issue["properties"]["labels"] = {"type": "array", "items": {"type": "string"}}
        issue["required"] = ["title", "labels"]
    ro = types.ToolAnnotations(read_only_hint=True)
    tools = [
        types.Tool(
            name="lookup",
            description="Look an issue up by its key.",
            input_schema={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
            annotations=ro,
        ),
        types.Tool(
            name="create_issue",
            description="Create an issue.",
            input_schema=issue,
            annotations=types.ToolAnnotations(destructive_hint=True),
        ),
        types.Tool(
            name="slow",
            description="Sleep, then answer.",
            input_schema={"type": "object", "properties": {"seconds": {"type": "number"}}},
            annotations=ro,
        ),
        types.Tool(name="crash", description="Exit mid-call.", input_schema={"type": "object"}),
        types.Tool(name="hang", description="Never answer.", input_schema={"type": "object"}, annotations=ro),
        types.Tool(
            name="malformed",
            description="A result that breaks its output schema.",
            input_schema={"type": "object"},
            output_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            annotations=ro,
        ),
        types.Tool(
            name="big",
            description="A large text result.",
            input_schema={"type": "object", "properties": {"mb": {"type": "number"}}, "required": ["mb"]},
            annotations=ro,
        ),
        types.Tool(
            name="set_flag",
            description="Set a flag (idempotent).",
            input_schema={"type": "object", "properties": {"flag": {"type": "string"}}, "required": ["flag"]},
            annotations=types.ToolAnnotations(idempotent_hint=True),
        ),
    ]
    if invalid_schema:
        tools.append(
            types.Tool(
                name="broken",
                description="Its schema is not JSON Schema.",
                input_schema={"type": "object", "properties": {"x": {"type": 12}}},
            )
        )
    return tools


def build(state: Path, variant: int, invalid_schema: bool, name: str) -> Server[Any]:
    effects = state / "effects.jsonl"

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_list(variant, invalid_schema))

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = dict(params.arguments or {})
        meta = dict(ctx.meta or {})
        with (state / "calls.jsonl").open("a") as f:
            f.write(json.dumps({"tool": params.name, "args": args, "meta": meta}) + "\n")
        return await handle(params.name, args, meta)

    async def handle(tool: str, args: dict[str, Any], meta: dict[str, Any]) -> types.CallToolResult:
        if tool == "lookup":
            found = [
                json.loads(line)
                for line in (effects.read_text().splitlines() if effects.exists() else [])
                if json.loads(line)["key"] == args["key"]
            ]
            return text(json.dumps(found[0]) if found else "none")
        if tool == "create_issue":
            record = {"key": meta.get("agentlife/invocation_id"), "title": args["title"], "pid": os.getpid()}
            with effects.open("a") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
                os.fsync(f.fileno())
            delay = state / "create_delay"
            if delay.exists():
                await anyio.sleep(float(delay.read_text()))
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=f"created {args['title']}")],
                structured_content={"created": args["title"]},
            )
        if tool == "slow":
            await anyio.sleep(float(args.get("seconds", 1)))
            return text("slept")
        if tool == "crash":
            os._exit(3)
        if tool == "hang":
            await anyio.sleep(3600)
        if tool == "malformed":
            return types.CallToolResult(
                content=[types.TextContent(type="text", text="{}")], structured_content={"n": "not a number"}
            )
        if tool == "big":
            return text("x" * int(float(args["mb"]) * 1024 * 1024))
        if tool == "set_flag":
            return text(f"flag {args['flag']} set")
        return types.CallToolResult(
            content=[types.TextContent(type="text", text="no such tool")], is_error=True
        )

    return Server(name, on_list_tools=list_tools, on_call_tool=call_tool)


def text(value: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=value)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("state", type=Path)
    parser.add_argument("--http", type=int, default=None)
    parser.add_argument("--variant", type=int, default=1)
    parser.add_argument("--invalid-schema", action="store_true")
    parser.add_argument("--name", default="tracker")
    options = parser.parse_args()
    options.state.mkdir(parents=True, exist_ok=True)
    with (options.state / "pid").open("a") as f:
        f.write(f"{os.getpid()} {time.time()}\n")
    server = build(options.state, options.variant, options.invalid_schema, options.name)
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
