"""The HTTP API's route table and the OpenAPI 3.1 document written from it.

`ROUTES` is the one list of what the API serves: the console adds each route from it
(`agentlife._console._api.add_routes`) and `openapi` writes the document from it, so the two cannot
disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentlife._console._data import MAX_ID
from agentlife._version import __version__
from agentlife.stores import JobStatus

__all__ = [
    "DEFAULT_WAIT",
    "MAX_LIMIT",
    "MAX_REASON",
    "MAX_WAIT",
    "PREFIX",
    "ROUTES",
    "Param",
    "Route",
    "openapi",
]

#: Where the API is served.
PREFIX = "/api/v1"
#: The longest ``result`` wait one request may ask for, and the wait when it asks none.
MAX_WAIT = 60.0
DEFAULT_WAIT = 30.0
#: The most jobs one page of the list holds.
MAX_LIMIT = 500
#: The longest reason an operator may give.
MAX_REASON = 500
STATUSES = frozenset(str(s) for s in JobStatus)


@dataclass(frozen=True, slots=True)
class Param:
    """A query parameter or header a route reads."""

    name: str
    where: str  # "query" or "header"
    schema: dict[str, Any]
    description: str


@dataclass(frozen=True, slots=True)
class Route:
    """One served route: what serves it (`Api` method ``op``) and what the OpenAPI document says of it."""

    method: str
    path: str
    op: str
    summary: str
    responses: tuple[int, ...]
    write: bool = False
    body: str | None = None  # the component schema of the request body
    answer: str | None = None  # the component schema of the 200 body
    params: tuple[Param, ...] = ()
    stream: bool = False


_ID = Param("job_id", "path", {"type": "string", "maxLength": MAX_ID}, "the job's id")
_REASON = {"type": "string", "maxLength": MAX_REASON}

ROUTES: tuple[Route, ...] = (
    Route("GET", "/openapi.json", "document", "This document", (200,)),
    Route(
        "GET",
        "/jobs",
        "list_jobs",
        "Jobs, most recently updated first, a page at a time",
        (200, 400, 503),
        answer="JobPage",
        params=(
            Param("status", "query", {"type": "string", "enum": sorted(STATUSES)}, "only this status"),
            Param("agent", "query", {"type": "string", "maxLength": MAX_ID}, "only this agent"),
            Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}, "rows (50)"),
            Param("after", "query", {"type": "string"}, "the next_cursor of the page before"),
        ),
    ),
    Route(
        "POST",
        "/jobs",
        "start",
        "Start a job; again with the same id, agent and payload: the same job",
        (200, 400, 401, 403, 409, 413, 415, 503),
        write=True,
        body="StartRequest",
        answer="Job",
    ),
    Route("GET", "/jobs/{job_id}", "get", "One job", (200, 400, 404, 503), answer="Job", params=(_ID,)),
    Route(
        "GET",
        "/jobs/{job_id}/result",
        "result",
        "Wait for the job's end: 200 COMPLETED, 409 FAILED or DEAD_LETTER, 202 not yet",
        (200, 202, 400, 404, 409, 503),
        answer="Result",
        params=(
            _ID,
            Param(
                "timeout",
                "query",
                {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_WAIT},
                f"seconds to wait ({DEFAULT_WAIT:g})",
            ),
        ),
    ),
    Route(
        "GET",
        "/jobs/{job_id}/events",
        "events",
        "The job's events as Server-Sent Events, resumable from Last-Event-ID",
        (200, 400, 404, 503),
        params=(
            _ID,
            Param("after", "query", {"type": "string"}, "the cursor of the last event seen"),
            Param("Last-Event-ID", "header", {"type": "string"}, "as after; wins over it"),
        ),
        stream=True,
    ),
    *(
        Route(
            "POST",
            f"/jobs/{{job_id}}/{op}",
            op,
            summary,
            (200, 400, 401, 403, 404, 409, 413, 415, 503),
            write=True,
            body=body,
            answer="JobSummary" if op != "send" else "Sent",
            params=(_ID,),
        )
        for op, summary, body in (
            ("send", "Send an event to the job (what wait_for_event takes)", "SendRequest"),
            ("approve", "Approve the call the job is parked on", "ApproveRequest"),
            ("reject", "Reject the call the job is parked on: it ends FAILED", "ReasonRequest"),
            ("cancel", "Cancel the job and its attached children", "ReasonRequest"),
            ("retry", "Make a FAILED or DEAD_LETTER job runnable again", "EmptyRequest"),
            ("pause", "Pause the job (a RUNNING one at its next step boundary)", "ReasonRequest"),
            ("resume", "Put a PAUSED job back where it was paused", "EmptyRequest"),
            (
                "rewind",
                "Start the job again from the checkpoint it had after to_step (in place: PENDING with the "
                "next attempt), or fork it into as_job_id; the side effects recorded after the step may "
                "happen again",
                "RewindRequest",
            ),
        )
    ),
    Route(
        "POST",
        "/batch/{action}",
        "batch",
        "Retry, cancel, pause or resume the jobs a selection names, each in its own transaction: with "
        "dry_run the ids and the count; else expect must be that count, as confirmed",
        (200, 400, 401, 403, 404, 409, 413, 415, 503),
        write=True,
        body="BatchRequest",
        answer="BatchResult",
        params=(
            Param(
                "action",
                "path",
                {"type": "string", "enum": ["cancel", "pause", "resume", "retry"]},
                "what to do to each job",
            ),
        ),
    ),
)


def openapi() -> dict[str, Any]:
    """The OpenAPI 3.1 document of `ROUTES`: every route served and nothing else."""
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(PREFIX + route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {"title": "agentlife console API", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        },
    }


def _operation(route: Route) -> dict[str, Any]:
    operation: dict[str, Any] = {"operationId": route.op, "summary": route.summary}
    params = [
        {
            "name": p.name,
            "in": p.where,
            "required": p.where == "path",
            "schema": p.schema,
            "description": p.description,
        }
        for p in route.params
    ]
    if params:
        operation["parameters"] = params
    if route.body is not None:
        schema = {"$ref": f"#/components/schemas/{route.body}"}
        operation["requestBody"] = {"required": False, "content": {"application/json": {"schema": schema}}}
    if route.write:
        operation["security"] = [{"token": []}]
    operation["responses"] = {str(status): _response(route, status) for status in route.responses}
    return operation


def _response(route: Route, status: int) -> dict[str, Any]:
    if status >= 400:
        return {"description": _REASONS[status], "content": _content("Error")}
    if status == 202:
        return {"description": _REASONS[status], "content": _content("Pending")}
    if route.stream:
        return {
            "description": "the event stream",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }
    if route.op == "document":
        return {
            "description": "this document",
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    return {"description": _REASONS[status], "content": _content(route.answer or "Job")}


def _content(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}


_REASONS = {
    200: "OK",
    201: "Created",
    202: "Not finished within the timeout: the job as it is now",
    400: "Bad input: the message says what",
    401: "No token",
    403: "A wrong token, writes off, or another origin",
    404: "No such job",
    409: "The job's status does not allow it",
    413: "The body is too large",
    415: "The body is not JSON",
    503: "The store cannot be reached, or too many event streams are open",
}
_ANY: dict[str, Any] = {}
_OBJECT = {"type": ["object", "null"]}
_TIME = {"type": ["number", "null"]}
_TEXT = {"type": "string"}
_SUMMARY = {
    "job_id": _TEXT,
    "agent_id": _TEXT,
    "status": _TEXT,
    "attempt": {"type": "integer"},
    "updated_at": _TIME,
    "crashes": {"type": "integer"},
    "finished": {"type": "boolean"},
}


def _record(properties: dict[str, Any], required: tuple[str, ...] | None = None) -> dict[str, Any]:
    """An object of exactly ``properties``, all of them required unless ``required`` names which."""
    return {
        "type": "object",
        "required": list(properties if required is None else required),
        "additionalProperties": False,
        "properties": properties,
    }


_SCHEMAS: dict[str, Any] = {
    "JobSummary": _record(_SUMMARY),
    "Job": _record(
        {
            **_SUMMARY,
            "payload": _ANY,
            "result": _ANY,
            "tokens_used": {"type": "object"},
            "budget": _OBJECT,
            "errors": {"type": "array", "maxItems": 20, "description": "the newest crash records"},
            "waits_for": {"type": "array", "items": _TEXT},
            "approval_request": _OBJECT,
            "waiting": _OBJECT,
            "events_kept": {"type": "object", "additionalProperties": {"type": "integer"}},
            "heartbeat_at": _TIME,
            "not_before": _TIME,
            "unreadable": {"type": "object", "additionalProperties": _TEXT},
            "concurrency_key": {"type": ["string", "null"]},
            "priority": {"type": "integer"},
            "paused": {
                "type": ["object", "null"],
                "description": "an operator's pause in force: reason, actor, at; requested while RUNNING",
            },
        }
    ),
    "JobPage": _record(
        {
            "jobs": {"type": "array", "items": {"$ref": "#/components/schemas/JobSummary"}},
            "next_cursor": {"type": ["string", "null"]},
        }
    ),
    "Result": _record({"job_id": _TEXT, "status": {"const": "COMPLETED"}, "result": _ANY}),
    "Pending": _record({"job_id": _TEXT, "status": _TEXT}),
    "Sent": _record({"job_id": _TEXT, "name": _TEXT, "seq": {"type": "integer"}}),
    "Error": _record(
        {
            "error": {
                "type": "object",
                "required": ["status", "code", "message"],
                "properties": {
                    "status": {"type": "integer"},
                    "code": _TEXT,
                    "message": _TEXT,
                    "job_status": _TEXT,
                    "last_error": _OBJECT,
                },
            }
        }
    ),
    "StartRequest": _record(
        {
            "agent_id": _TEXT,
            "payload": _ANY,
            "job_id": {"type": "string", "maxLength": 128},
            "concurrency_key": {"type": ["string", "null"], "maxLength": 200},
            "priority": {"type": "integer", "minimum": -1000, "maximum": 1000},
        },
        ("agent_id",),
    ),
    "SendRequest": _record({"name": {"type": "string", "maxLength": 200}, "payload": _ANY}, ("name",)),
    "ApproveRequest": _record({"call": {"type": ["string", "null"]}}, ()),
    "ReasonRequest": _record({"reason": _REASON}, ()),
    "EmptyRequest": {"type": "object", "additionalProperties": False},
    "BatchRequest": _record(
        {
            "ids": {"type": "array", "items": {"type": "string", "maxLength": 128}, "maxItems": 10_000},
            "status": {"type": ["string", "null"], "enum": [*sorted(STATUSES), None]},
            "agent_id": {"type": ["string", "null"], "maxLength": MAX_ID},
            "older_than": {"type": ["string", "null"], "description": "an age: 30m, 12h, 7d"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100_000},
            "dry_run": {"type": "boolean"},
            "expect": {"type": "integer", "minimum": 1, "description": "the count the operator confirmed"},
            "digest": {"type": "string", "description": "the dry run's digest: act on exactly those jobs"},
            "reason": _REASON,
        },
        (),
    ),
    "BatchResult": _record(
        {
            "action": _TEXT,
            "count": {"type": "integer"},
            "digest": _TEXT,
            "job_ids": {"type": "array", "items": _TEXT},
            "done": {"type": "array", "items": _TEXT},
            "skipped": {
                "type": "array",
                "items": _record({"job_id": _TEXT, "reason": _TEXT}),
            },
        }
    ),
    "RewindRequest": _record(
        {
            "to_step": {"type": "integer", "minimum": 0},
            "as_job_id": {"type": ["string", "null"]},
            "force": {"type": "boolean"},
            "reason": _REASON,
        },
        ("to_step",),
    ),
}
