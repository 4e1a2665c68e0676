"""An MCP stdio server that misbehaves on purpose (plain JSON-RPC, no SDK import).

``python tests/mcp_hostile_server.py MODE [N]``, MODE one of:

- ``garbage``: writes a banner, a JSON line that is not JSON-RPC, and undecodable bytes on stdout before
  it answers ``initialize``; then serves ``echo`` properly.
- ``late-garbage``: serves ``echo``, and writes a line that is not JSON-RPC before each answer to a call.
- ``only-garbage``: writes garbage and never answers.
- ``many N``: lists N tools (``t0`` ... ``tN-1``), in one answer.
- ``names``: lists tools whose names are hostile (spaces, 200 characters, unicode, names that collide once
  made safe or prefixed, an empty name, a name listed twice, a 200 kB description).
- ``patterns``: lists ``evil`` (a catastrophic ``pattern``), ``backref`` (a back reference),
  ``propnames`` (``patternProperties``) and ``remote`` (a ``$ref`` to ``http://HOST:PORT`` from
  ``MCP_REMOTE_REF``).

Every tool answers ``called NAME`` and appends its name to the file named by ``MCP_CALLS`` (if set).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

STRING = {"type": "string"}


def tools(mode: str, n: int) -> list[dict[str, Any]]:
    def tool(name: str, schema: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
        return {
            "name": name,
            "inputSchema": schema or {"type": "object"},
            "annotations": {"readOnlyHint": True},
            **more,
        }

    if mode == "many":
        return [tool(f"t{i}", description=f"Tool number {i}.") for i in range(n)]
    if mode == "names":
        return [
            tool("look up"),
            tool("look_up"),
            tool("x" * 200),
            tool("x" * 199 + "y"),
            tool("café"),
            tool("caf_"),
            tool("日本語"),
            tool("srv__echo"),
            tool("echo"),
            tool(""),
            tool("twice"),
            tool("twice"),
            tool("huge", description="d" * 200_000),
        ]
    if mode == "patterns":
        remote = os.environ.get("MCP_REMOTE_REF", "http://127.0.0.1:9/schema.json")

        def one(name: str, prop: dict[str, Any]) -> dict[str, Any]:
            return tool(name, {"type": "object", "properties": {"v": prop}, "required": ["v"]})

        return [
            one("evil", {"type": "string", "pattern": "^(a+)+$"}),
            one("polynomial", {"type": "string", "pattern": "\\d*\\d*\\d*x"}),
            one("backref", {"type": "string", "pattern": "(a)\\1"}),
            tool("propnames", {"type": "object", "patternProperties": {"^(a+)+$": STRING}}),
            one("remote", {"$ref": remote}),
        ]
    return [tool("echo", {"type": "object", "properties": {"v": STRING}})]


def main() -> None:
    mode = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    out = sys.stdout.buffer
    if mode in ("garbage", "only-garbage"):
        out.write(b"Starting server v1.0 ...\n")
        out.write(b'{"hello": "not json-rpc"}\n')
        out.write(b"\xff\xfe\x00 binary \x80\n")
        out.flush()
    if mode == "only-garbage":
        for line in sys.stdin:
            out.write(b"nope: " + line[:20].encode(errors="replace") + b"\n")
            out.flush()
        return
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        method, params = message.get("method"), message.get("params") or {}
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": params.get("protocolVersion"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "srv", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": tools(mode, n)}
        elif method == "tools/call":
            if mode == "late-garbage":
                out.write(b"debug: calling " + params["name"].encode() + b"\n")
            if os.environ.get("MCP_CALLS"):
                with open(os.environ["MCP_CALLS"], "a") as f:
                    f.write(params["name"] + "\n")
            result = {"content": [{"type": "text", "text": f"called {params['name']}"}]}
        else:
            result = {}
        out.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
