"""A small MCP server for the example: a notes store with a read-only and a side-effecting tool.

Run by the agent in ``mcp_notes_agent.py`` as a child process over stdio. ``add_note`` takes the caller's
invocation id from the request's ``_meta`` as an idempotency key: the same key never adds a second note.

    python examples/mcp_notes_server.py NOTES_FILE
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

KEY = "agentlife/invocation_id"


def main() -> None:
    notes = Path(sys.argv[1])

    def load() -> list[dict[str, Any]]:
        return [json.loads(line) for line in notes.read_text().splitlines()] if notes.exists() else []

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        text = {
            "type": "object",
            "properties": {"text": {"type": "string", "minLength": 1}},
            "required": ["text"],
        }
        key = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name="list_notes",
                    description="All notes.",
                    input_schema={"type": "object"},
                    annotations=types.ToolAnnotations(read_only_hint=True),
                ),
                types.Tool(
                    name="find_note",
                    description="The note added with this idempotency key.",
                    input_schema=key,
                    annotations=types.ToolAnnotations(read_only_hint=True),
                ),
                types.Tool(
                    name="add_note",
                    description="Add a note.",
                    input_schema=text,
                    annotations=types.ToolAnnotations(destructive_hint=False),
                ),
            ]
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        if params.name == "list_notes":
            return types.CallToolResult(content=[], structured_content={"notes": [n["text"] for n in load()]})
        if params.name == "find_note":
            found = [n for n in load() if n["key"] == args["key"]]
            return types.CallToolResult(content=[], structured_content={"note": found[0] if found else None})
        key = (ctx.meta or {}).get(KEY)
        if not any(n["key"] == key for n in load()):
            with notes.open("a") as f:
                f.write(json.dumps({"key": key, "text": args["text"]}) + "\n")
        return types.CallToolResult(content=[], structured_content={"added": args["text"]})

    server: Server[Any] = Server("notes", on_list_tools=list_tools, on_call_tool=call_tool)

    async def run() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(run)


if __name__ == "__main__":
    main()
