"""JSON log lines on stdout, one object per line, with the lifecycle context and secrets redacted."""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from types import MappingProxyType
from typing import IO, Any

import orjson

from agentlife._redact import Redactor
from agentlife._replay import utf8_safe

__all__ = [
    "JOB_ATTRIBUTES",
    "JsonLogHandler",
    "get_logger",
    "installed_json_logging",
    "job_attributes",
    "job_log_context",
    "process_logging",
]

#: The job the current task runs, as telemetry attributes (``job.id``, ``job.attempt``); empty outside a job.
#: Per task, not per process: in a worker every span and measurement of a job names that job, whatever else
#: the process runs at the same time.
JOB_ATTRIBUTES: ContextVar[Mapping[str, Any]] = ContextVar(
    "agentlife_job_attributes", default=MappingProxyType({})
)


@contextmanager
def job_attributes(job_id: str, attempt: int) -> Iterator[None]:
    """Bind ``job.id`` and ``job.attempt`` to the current task (and the tasks it starts) for the block."""
    token = JOB_ATTRIBUTES.set(MappingProxyType({"job.id": job_id, "job.attempt": attempt}))
    try:
        yield
    finally:
        JOB_ATTRIBUTES.reset(token)


#: The log fields of the job the current task runs (job_id, agent_id, attempt, state, step); None outside a
#: job. A mutable dict per job, bound in the job's task: the job updates its state and step in place, and
#: a record names the job whose task emitted it, never another job of the same loop.
JOB_LOG_CONTEXT: ContextVar[dict[str, Any] | None] = ContextVar("agentlife_job_log_context", default=None)


@contextmanager
def job_log_context(fields: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Bind a job's log ``fields`` to the current task (and the tasks it starts) for the block.

    The dict itself is bound: the job updates its state and step in it as they change.
    """
    token = JOB_LOG_CONTEXT.set(fields)
    try:
        yield fields
    finally:
        JOB_LOG_CONTEXT.reset(token)


ContextFn = Callable[[], dict[str, Any]]


def get_logger(name: str = "agentlife") -> logging.Logger:
    """The stdlib logger ``name``; agentlife's own loggers live under ``agentlife``."""
    return logging.getLogger(name)


class JsonLogHandler(logging.Handler):
    """Formats each record as one JSON object: ts, level, logger, msg, the context, extras, exception."""

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        context: ContextFn | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        super().__init__()
        self._stream = stream
        self._context = context
        self._redactor = redactor or Redactor()
        self._broken = False

    def to_dict(self, record: logging.LogRecord) -> dict[str, Any]:
        """The JSON object for ``record``, already redacted."""
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self._context is not None:
            out.update(self._context())
        job = JOB_LOG_CONTEXT.get()
        if job is not None:
            out.update(job)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            out["error"] = f"{type(exc).__name__}: {exc}"
            out["traceback"] = "".join(traceback.format_exception(exc)).rstrip()
        redacted = self._redactor.redact_obj(out)
        assert isinstance(redacted, dict)
        return redacted

    def emit(self, record: logging.LogRecord) -> None:
        if self._broken:
            return
        try:
            fields = self.to_dict(record)
            try:
                line = orjson.dumps(fields, default=str).decode()
            except TypeError:  # a lone surrogate or a huge int, which orjson refuses
                line = orjson.dumps(_writable(fields), default=str).decode()
            stream = self._stream or sys.stdout
            stream.write(line + "\n")
            stream.flush()
        except OSError:
            # stdout closed under us (a broken pipe): losing log lines must not cost the agent its work.
            self._broken = True
        except Exception:
            self.handleError(record)


def _writable(value: Any) -> Any:
    """A copy orjson writes: lone surrogates as their escapes, ints beyond 64 bits as strings.

    The values come from the redactor's bounded walk (no cycles, at most 254 levels).
    """
    if isinstance(value, str):
        return utf8_safe(value)
    if isinstance(value, Mapping):
        return {utf8_safe(str(k)): _writable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_writable(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return str(value)
    return value


@contextmanager
def installed_json_logging(
    level: str,
    *,
    context: ContextFn | None = None,
    redactor: Redactor | None = None,
    stream: IO[str] | None = None,
) -> Iterator[JsonLogHandler]:
    """Route the root logger through a `JsonLogHandler` for the duration of the block.

    The process's own handlers are set aside and restored afterwards, so a test harness that runs
    several agents in one interpreter gets its logging back untouched.
    """
    root = logging.getLogger()
    handler = JsonLogHandler(stream, context=context, redactor=redactor)
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers = [handler]
    root.setLevel(level)
    # Chatty third-party loggers stay at WARNING unless the user asked for DEBUG.
    if level != "DEBUG":
        for name in ("httpx", "httpcore", "anthropic", "asyncio", "aiohttp.access"):
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        yield handler
    finally:
        root.handlers = saved_handlers
        root.setLevel(saved_level)


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def process_logging(
    env: Mapping[str, str],
    *,
    enabled: bool,
    context: ContextFn | None = None,
    redactor: Redactor | None = None,
    stream: IO[str] | None = None,
) -> AbstractContextManager[object]:
    """JSON logs at ``AGENTLIFE_LOG_LEVEL`` (INFO when unset or unknown) for an agent process.

    A no-op context when ``enabled`` is False: the caller routes logging itself.
    """
    if not enabled:
        return nullcontext()
    level = (env.get("AGENTLIFE_LOG_LEVEL") or "INFO").upper()
    return installed_json_logging(
        level if level in _LEVELS else "INFO", context=context, redactor=redactor, stream=stream
    )


def log_fields(**fields: Any) -> dict[str, Any]:
    """``extra=`` for a log call that adds structured fields to the JSON line."""
    return {"fields": fields}
