"""An example tool-using agent to copy: it triages a GitHub issue and reports a structured result.

Run it on the embedded defaults (SQLite, a scripted model when no provider is configured)::

    PYTHONPATH=examples python -m agentlife run issue_triage_agent:IssueTriage \
        --job-id triage-1 --create-job --payload '{"prompt": "Triage issue #7."}'

or against a model server: ``ANTHROPIC_API_KEY`` (and ``ANTHROPIC_BASE_URL``), or
``AGENTLIFE_LLM_PROVIDER=openai`` with ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (OpenAI, vLLM, Ollama,
LiteLLM). The agent itself is the ~20 lines of ``IssueTriage``; everything else is its tools.

What it shows:

* tool definitions derived from the functions (docstrings, type hints, ``Literal``), checked before a
  tool runs: bad arguments from the model go back to it as an error, never reach the tool;
* a side-effecting tool (``label_issue``) made exactly-once across crashes by ``verify``, keyed by the
  stable ``invocation_id``;
* a structured final answer (``output_type``), validated, stored as the job's result;
* the conversation saved step by step: a drained or killed triage resumes where it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import anyio
from pydantic import BaseModel

from agentlife import NOT_DONE, LLMClient, ScriptedLLM, ScriptedTurn, ToolAgent, tool

Label = Literal["bug", "feature", "question", "docs"]

ISSUES = {
    7: {
        "title": "Crash on start when the config file is empty",
        "body": "agentlife run exits with a traceback if agentlife.toml exists but is empty.",
    },
    8: {"title": "Support Ollama", "body": "It would be nice to run agents on a local model."},
}

DOCS = {
    "configuration": "Configuration comes from AGENTLIFE_* variables; an empty file is an error.",
    "providers": "Anthropic by default; AGENTLIFE_LLM_PROVIDER=openai for OpenAI-compatible servers.",
    "drains": "On SIGTERM the current step finishes, is checkpointed, and the process exits 143.",
}


@tool(side_effects=False)
async def get_issue(number: int) -> dict[str, str]:
    """Fetch an issue's title and body.

    Args:
        number: the issue number.
    """
    await _pause()
    issue = ISSUES.get(number)
    if issue is None:
        raise LookupError(f"no issue #{number}")
    return issue


@tool(side_effects=False)
async def search_docs(query: str, limit: int = 2) -> list[str]:
    """Search the project's documentation.

    Args:
        query: words to look for.
        limit: how many passages to return at most.
    """
    await _pause()
    words = {word.lower() for word in query.split()}
    hits = [text for topic, text in DOCS.items() if words & {topic, *text.lower().split()}]
    return hits[:limit]


async def _label_applied(invocation_id: str) -> Any:
    """``verify`` for label_issue: the labels log holds a line for this invocation once it was applied."""
    path = _labels_path()
    if not path.exists():
        return NOT_DONE
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:  # a line torn by a crash mid-write was never applied
            continue
        if entry.get("invocation_id") == invocation_id:
            return entry["result"]
    return NOT_DONE


@tool(verify=_label_applied)
async def label_issue(number: int, label: Label, invocation_id: str) -> str:
    """Apply one label to an issue (a side effect: done at most once per call).

    Args:
        number: the issue number.
        label: the label to apply.
    """
    await _pause()
    result = f"issue #{number} labelled {label}"
    path = _labels_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"invocation_id": invocation_id, "number": number, "label": label, "result": result})
    with path.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    return result


class Triage(BaseModel):
    """The triage report: the job's result."""

    number: int
    label: Label
    priority: Literal["low", "medium", "high"]
    summary: str


class IssueTriage(ToolAgent):
    """Read the issue, search the docs, apply one label, report."""

    agent_id = "issue-triage"
    model = os.environ.get("TRIAGE_MODEL", "claude-sonnet-4-5")
    system = "You triage GitHub issues: read the issue, search the docs, apply exactly one label, report."
    tools = (get_issue, search_docs, label_issue)
    output_type = Triage
    max_turns = 8
    max_tokens = 1024

    def make_llm(self) -> LLMClient:
        configured = ("ANTHROPIC_API_KEY", "AGENTLIFE_LLM_PROVIDER")
        if any(os.environ.get(name) for name in configured):
            return super().make_llm()
        return ScriptedLLM(SCRIPT)


#: What a model does with issue #7, turn by turn: addressed by (step, call), so a resumed job continues here.
SCRIPT: dict[tuple[int, int], ScriptedTurn | str] = {
    (0, 0): ScriptedTurn.tool_use("get_issue", {"number": 7}, id="toolu_01"),
    (1, 0): ScriptedTurn.tool_use("search_docs", {"query": "empty configuration file"}, id="toolu_02"),
    (2, 0): ScriptedTurn.tool_use("label_issue", {"number": 7, "label": "bug"}, id="toolu_03"),
    (3, 0): ScriptedTurn.tool_use(
        "final_result",
        {"number": 7, "label": "bug", "priority": "high", "summary": "Empty config file crashes start-up."},
        id="toolu_04",
    ),
}


def _labels_path() -> Path:
    return Path(os.environ.get("TRIAGE_OUTBOX", ".agentlife/triage")) / "labels.jsonl"


async def _pause() -> None:
    """A stand-in for the latency of a real API (``TRIAGE_TOOL_DELAY`` seconds), for the demos and tests."""
    delay = float(os.environ.get("TRIAGE_TOOL_DELAY", "0"))
    if delay > 0:
        await anyio.sleep(delay)


if __name__ == "__main__":
    IssueTriage.main()
