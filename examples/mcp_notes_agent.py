"""An agent whose tools come from an MCP server (``mcp_notes_server.py``), with the same exactly-once rules.

``list_notes`` is read-only (re-run on resume); ``add_note`` is side-effecting: journaled write-ahead, and
after a crash mid-call its ``verify`` looks the note up by the invocation id (the server's idempotency key)
instead of adding it twice. The model is scripted so the example runs offline::

    AGENTLIFE_DATA_DIR=/tmp/notes python -m agentlife run mcp_notes_agent:NotesAgent --job-id notes-1
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, ClassVar

from agentlife import NOT_DONE, LLMClient, MCPServer, ScriptedLLM, ScriptedTurn, ToolAgent

HERE = Path(__file__).resolve().parent
NOTES = os.environ.get("NOTES_FILE", str(Path(os.environ.get("AGENTLIFE_DATA_DIR", ".")) / "notes.jsonl"))


async def find_note(invocation_id: str) -> Any:
    """Ask the server whether the note of this call was already added (after a crash mid-call)."""
    import json

    path = Path(NOTES)
    for line in path.read_text().splitlines() if path.exists() else []:
        note = json.loads(line)
        if note["key"] == invocation_id:
            return {"added": note["text"]}
    return NOT_DONE


notes = MCPServer.stdio(sys.executable, [str(HERE / "mcp_notes_server.py"), NOTES], name="notes").with_tool(
    "add_note", verify=find_note
)


class NotesAgent(ToolAgent):
    """Reads the notes, adds one, answers."""

    agent_id = "notes"
    system = "You keep notes."
    tools: ClassVar[Any] = (notes,)

    def make_llm(self) -> LLMClient:
        return ScriptedLLM(
            [
                ScriptedTurn.tool_use("list_notes", {}),
                ScriptedTurn.tool_use("add_note", {"text": "ship the MCP example"}),
                "Noted.",
            ]
        )
