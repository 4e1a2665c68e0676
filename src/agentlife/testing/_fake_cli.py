"""The fake model servers as a process: ``python -m agentlife.testing fake-anthropic|fake-openai``.

Run a whole agent process (``python -m agentlife run ...``) against a scripted model::

    python -m agentlife.testing fake-openai --port 8900 --script turns.json --requests-log requests.jsonl
    AGENTLIFE_LLM_PROVIDER=openai OPENAI_BASE_URL=http://127.0.0.1:8900/v1 python -m agentlife run app:Agent

The server prints one line, its base URL (``http://127.0.0.1:8900`` for ``fake-anthropic``, the same plus
``/v1`` for ``fake-openai``), then serves until SIGTERM or SIGINT and exits 0. Without ``--script`` every
request gets a short fixed text. A bad script or an unusable port is one line on stderr and exit 2.

**The script** (``--script FILE``) is JSON: a list of turns, one per request in order, or an object
``{"STEP/CALL": turn}`` whose turns answer the requests carrying that ``x-agentlife-invocation`` (every
``ctx.llm`` call sends ``{job_id}/{step}/{call}``), so a resumed or re-sent call gets its own turn again;
there a value may also be a list of turns, one per request of that call (the last repeats). A turn is a
string (the reply's text) or an object with one of these keys:

* ``{"text": "Hi"}``: a text reply;
* ``{"tool_use": {"name": "search", "input": {"q": "x"}}}``: a tool call (``"id"`` optional, and a
  ``"text"`` to say first);
* ``{"thinking": "Hmm", "text": "Hi"}``: thinking, then text (``"pause"``: seconds of keep-alives between);
* ``{"stall_after_chunks": 2}``: two text chunks, then silence with the connection open;
* ``{"trickle": 0.5}``: keep-alives every 0.5 s, forever (only the total timeout ends it);
* ``{"never_answer": true}``: accept the request and never answer;
* ``{"http_error": 429, "retry_after": 1}``: an error status (``"message"`` optional).

Text, tool_use and thinking turns also take ``"chunks"`` (deltas per text), ``"delay"`` (seconds before
each) and ``"usage"`` (``{"input_tokens": 10, "output_tokens": 5}``; estimated when absent).

``--requests-log FILE`` appends one JSON line per request received (``number``, ``invocation``, ``path``,
``model``), flushed at once, so a test outside the process can count re-sent requests.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import anyio
import orjson

from agentlife._exceptions import ConfigError
from agentlife._llm._protocol import Usage
from agentlife._llm._scripted import ScriptedTurn
from agentlife.testing._anthropic_server import FakeAnthropicServer
from agentlife.testing._fake_server import FakeModelServer, FakeRequest, ProviderLimits, Script
from agentlife.testing._openai_server import FakeOpenAIServer

__all__ = ["DEFAULT_TEXT", "load_script", "main", "turn_from_json"]

#: The answer to every request when no script is given.
DEFAULT_TEXT = "Hello from the agentlife fake model server."
_KINDS = ("text", "tool_use", "thinking", "stall_after_chunks", "trickle", "never_answer", "http_error")
_STREAM_OPTIONS = {"chunks", "delay", "usage"}
_ALLOWED = {
    "text": _STREAM_OPTIONS,
    "tool_use": _STREAM_OPTIONS | {"text"},
    "thinking": _STREAM_OPTIONS | {"text", "pause"},
    "stall_after_chunks": {"text", "delay"},
    "trickle": set(),
    "never_answer": set(),
    "http_error": {"retry_after", "message"},
}


def turn_from_json(value: Any, where: str = "turn") -> ScriptedTurn:
    """The `ScriptedTurn` a JSON turn of the script format describes.

    Raises:
        ConfigError: one line naming ``where`` and what is wrong.
    """
    if isinstance(value, str):
        return ScriptedTurn.text(value)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: a turn is a string or an object, not {type(value).__name__}")
    # "text" goes with tool_use, thinking and stall turns too; alone, it is a text turn.
    kinds = [k for k in _KINDS if k in value and k != "text"] or [k for k in ("text",) if k in value]
    if len(kinds) != 1:
        raise ConfigError(f"{where}: a turn has exactly one of {', '.join(_KINDS)}")
    kind = kinds[0]
    extra = set(value) - {kind} - _ALLOWED[kind]
    if extra:
        raise ConfigError(f"{where}: {kind} turns take no {', '.join(sorted(extra))}")
    try:
        return _build(kind, value)
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _build(kind: str, value: Mapping[str, Any]) -> ScriptedTurn:
    stream: dict[str, Any] = {
        "chunks": _number(value, "chunks", int, 1),
        "delay": _number(value, "delay", float, 0.0),
    }
    if "usage" in value:
        usage = value["usage"]
        if not isinstance(usage, Mapping):
            raise ValueError("usage is an object of token counts")
        stream["usage"] = Usage(**{k: int(v) for k, v in usage.items()})
    if kind == "text":
        return ScriptedTurn.text(_string(value, "text"), **stream)
    if kind == "tool_use":
        call = value["tool_use"]
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
            raise ValueError('tool_use is {"name": ..., "input": {...}}')
        arguments = call.get("input", {})
        if not isinstance(arguments, Mapping) or set(call) - {"name", "input", "id"}:
            raise ValueError('tool_use is {"name": ..., "input": {...}, "id": ...}')
        text = value.get("text")
        return ScriptedTurn.tool_use(
            call["name"], arguments, id=call.get("id"), text=None if text is None else str(text), **stream
        )
    if kind == "thinking":
        pause = _number(value, "pause", float, 0.0)
        return ScriptedTurn.thinking(
            _string(value, "thinking"), str(value.get("text", "")), pause=pause, **stream
        )
    if kind == "stall_after_chunks":
        after = _number(value, "stall_after_chunks", int, 2)
        return ScriptedTurn.stall(
            str(value.get("text") or "This reply will never finish"),
            after_chunks=after,
            delay=stream["delay"],
        )
    if kind == "trickle":
        interval = _number(value, "trickle", float, 0.5)
        if not interval > 0:
            raise ValueError("trickle is the seconds between keep-alives, > 0")
        return ScriptedTurn.trickle(interval)
    if kind == "never_answer":
        return ScriptedTurn.never_answer()
    status = _number(value, "http_error", int, 500)
    retry_after = value.get("retry_after")
    if retry_after is not None and (
        isinstance(retry_after, bool) or not isinstance(retry_after, (int, float))
    ):
        raise ValueError("retry_after is a number of seconds")
    message = value.get("message")
    return ScriptedTurn.http_error(
        status,
        retry_after=None if retry_after is None else float(retry_after),
        message=None if message is None else str(message),
    )


def _number(value: Mapping[str, Any], key: str, kind: type[int] | type[float], default: float) -> Any:
    raw = value.get(key, default)
    if (
        isinstance(raw, bool)
        or not isinstance(raw, (int, float))
        or (kind is int and not isinstance(raw, int))
    ):
        raise ValueError(f"{key} must be {'a whole number' if kind is int else 'a number'}, not {raw!r}")
    if raw < 0:
        raise ValueError(f"{key} must be >= 0, not {raw!r}")
    return kind(raw)


def _string(value: Mapping[str, Any], key: str) -> str:
    raw = value.get(key)
    if not isinstance(raw, str):
        raise TypeError(f"{key} must be a string")
    return raw


def load_script(path: Path) -> Script:
    """Read a script file: a list of turns or ``{"STEP/CALL": turn or [turns]}``.

    Raises:
        ConfigError: the file cannot be read, is not JSON, or holds a bad turn (one line).
    """
    try:
        data = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"cannot read the script {str(path)!r}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"the script {str(path)!r} is not JSON: {exc}") from None
    if isinstance(data, list):
        return [turn_from_json(turn, f"turn {i}") for i, turn in enumerate(data)]
    if not isinstance(data, dict):
        raise ConfigError('a script is a list of turns or an object {"STEP/CALL": turn}')
    script: dict[tuple[int, int], list[ScriptedTurn]] = {}
    for key, value in data.items():
        step, sep, call = key.partition("/")
        if not (sep and step.isdigit() and call.isdigit()):
            raise ConfigError(f'script key {key[:40]!r} is not STEP/CALL (two whole numbers, e.g. "0/0")')
        turns = value if isinstance(value, list) else [value]
        if not turns:
            raise ConfigError(f"script key {key!r} has an empty list of turns")
        script[(int(step), int(call))] = [turn_from_json(t, f"turn {key!r}") for t in turns]
    return script


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agentlife.testing",
        description="Serve a scripted fake model API on this machine until SIGTERM or SIGINT.",
    )
    parser.add_argument("server", choices=("fake-anthropic", "fake-openai"), help="the wire format to speak")
    parser.add_argument("--port", type=int, default=0, help="the port to listen on (default 0: any free one)")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    parser.add_argument("--script", type=Path, help="a JSON file of turns (see the module's documentation)")
    parser.add_argument("--requests-log", type=Path, help="append one JSON line per request to this file")
    parser.add_argument("--api-key", help="refuse requests without this key (401), like the real API")
    parser.add_argument("--rpm", help="requests per minute to allow; past it, 429s as the real API sends")
    parser.add_argument("--input-tpm", help="input tokens per minute to allow (OpenAI's fake: its tokens)")
    parser.add_argument("--output-tpm", help="output tokens per minute to allow")
    parser.add_argument(
        "--latency", help="LOW,HIGH: each answer starts after a uniform draw in seconds (e.g. 0.02,0.2)"
    )
    return parser


def limits_from_args(args: argparse.Namespace) -> ProviderLimits | None:
    """``--rpm``, ``--input-tpm``, ``--output-tpm`` as `ProviderLimits`, None when none is given.

    Raises:
        ConfigError: a value that is not a whole number from 1 to 10**9.
    """
    values: dict[str, int] = {}
    for flag, attr in (
        ("rpm", "requests_per_minute"),
        ("input_tpm", "input_tokens_per_minute"),
        ("output_tpm", "output_tokens_per_minute"),
    ):
        raw = getattr(args, flag)
        if raw is None:
            continue
        text = str(raw).strip()
        if not text.isdigit() or len(text) > 10 or not 1 <= int(text) <= 10**9:
            raise ConfigError(
                f"--{flag.replace('_', '-')} {str(raw)[:20]!r} must be a whole number from 1 to 10**9"
            )
        values[attr] = int(text)
    return ProviderLimits(**values) if values else None


def latency_from_args(raw: str | None) -> tuple[float, float] | None:
    """``--latency LOW,HIGH`` in seconds.

    Raises:
        ConfigError: not two numbers with 0 <= LOW <= HIGH <= 60.
    """
    if raw is None:
        return None
    low, sep, high = raw.partition(",")
    try:
        pair = (float(low), float(high if sep else low))
    except ValueError:
        pair = (math.nan, math.nan)
    if not (0 <= pair[0] <= pair[1] <= 60):
        raise ConfigError(f"--latency {raw[:40]!r} must be LOW,HIGH seconds with 0 <= LOW <= HIGH <= 60")
    return pair


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 after SIGTERM or SIGINT, 2 for bad input)."""
    args = _parser().parse_args(argv)
    try:
        script: Script = load_script(args.script) if args.script is not None else []
        if not 0 <= args.port <= 65535:
            raise ConfigError(f"--port {args.port} is not a port number (0-65535)")
        limits, latency = limits_from_args(args), latency_from_args(args.latency)
        log = args.requests_log.open("a", encoding="utf-8") if args.requests_log is not None else None
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"error: cannot open --requests-log: {exc.strerror or exc}\n")
        return 2
    try:
        return anyio.run(_serve, args, script, log, limits, latency)
    finally:
        if log is not None:
            log.close()


async def _serve(
    args: argparse.Namespace,
    script: Script,
    log: IO[str] | None,
    limits: ProviderLimits | None,
    latency: tuple[float, float] | None,
) -> int:
    servers: dict[str, type[FakeModelServer]] = {
        "fake-openai": FakeOpenAIServer,
        "fake-anthropic": FakeAnthropicServer,
    }
    server_cls = servers[args.server]

    def record(request: FakeRequest) -> None:
        if log is not None:
            line = {
                "number": request.number,
                "invocation": request.invocation,
                "path": request.path,
                "model": request.body.get("model"),
            }
            log.write(orjson.dumps(line).decode() + "\n")
            log.flush()

    server = server_cls(
        script,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        default_turn=None if args.script is not None else DEFAULT_TEXT,
        on_request=record,
        limits=limits,
        latency=latency,
    )
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        try:
            await server.start()
        except OSError as exc:
            sys.stderr.write(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}\n")
            return 2
        try:
            sys.stdout.write(server.base_url + "\n")
            sys.stdout.flush()
            async for _ in signals:
                break
        finally:
            await server.close()
    return 0
