"""``python -m agentlife job create|show|list|approve|reject|cancel|retry|pause|resume|rewind``: job rows.

The store is the one every command uses (``--database-url``, else ``AGENTLIFE_DATABASE_URL``, else the
embedded SQLite file under ``AGENTLIFE_DATA_DIR``). Only ``create`` may create a SQLite store; every other
command on a file that is not there says ``no store at PATH`` (exit 1) rather than create an empty one and
report no jobs. Exit codes (`ExitCode`): 0 done, 1 store error, 2 usage (a bad id, a payload that is not
JSON), 3 no such job, 4 the job's status does not allow the operation (approve of a job that is not
parked, ...), the message naming the status.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from agentlife._cli._batch import add_selection, batch_or_single
from agentlife._cli._common import Parser, say
from agentlife._cli._prune import add_prune
from agentlife._cli._run import _parse_payload
from agentlife._config import (
    MAX_ATTEMPT,
    database_url_from_env,
    validate_agent_id,
    validate_database_url,
    validate_job_id,
    validate_payload,
)
from agentlife._exceptions import ConfigError, JobNotFound, JobStateConflict, StoreError
from agentlife._exitcode import ExitCode
from agentlife._jobs._actor import check_actor, default_actor
from agentlife._jobs._approve import approve_parked
from agentlife._jobs._mask import masker_for
from agentlife._jobs._pause import pause_job, resume_job
from agentlife._jobs._reason import check_reason
from agentlife._jobs._rewind import RewindPlan, parse_step, plan_rewind, rewind_job
from agentlife._jobs._start import check_start, create_job
from agentlife._jobs._view import (
    SHOWN_CHILDREN,
    call_text,
    missing_job,
    more,
    read_job_state,
    show_job,
    to_json,
    utc,
)
from agentlife._journal._show import format_timeline
from agentlife._journal._writer import list_sessions
from agentlife.constants import MAX_ENV_INTEGER
from agentlife.stores import (
    CheckpointStore,
    JobRecord,
    JobStatus,
    OperatorStore,
    store_from_url,
)
from agentlife.stores._childjobs import cancel_with_children
from agentlife.stores._events import check_event
from agentlife.stores._jobs import is_crash
from agentlife.stores._limits import PRIORITY_MAX, PRIORITY_MIN, parse_priority, validate_concurrency_key
from agentlife.stores._rows import JSON_COLUMNS

__all__ = ["open_store", "register"]

#: How many journal lines ``job show`` prints by default.
DEFAULT_EVENTS = 15
#: The most rows ``job list --limit`` asks for (what every store's LIMIT takes).
MAX_LIMIT = MAX_ATTEMPT
_T = TypeVar("_T")


def register(sub: Any) -> None:
    """Add ``job`` and its subcommands to the ``python -m agentlife`` parser."""
    job = sub.add_parser(
        "job",
        help="create, inspect and operate job rows",
        description="Create, inspect and operate job rows in the store. Exit codes: "
        f"{ExitCode.DONE} done, {ExitCode.CRASH} store error, {ExitCode.USAGE} usage, "
        f"{ExitCode.NOT_FOUND} no such job, {ExitCode.CONFLICT} the job's status does not allow it.",
    )
    commands = job.add_subparsers(dest="job_command", metavar="COMMAND", parser_class=Parser)
    commands.required = True

    create = _command(commands, "create", "insert a PENDING job row", _create, must_exist=False)
    create.add_argument("agent_id", metavar="AGENT_ID", help="the agent the job is for")
    create.add_argument(
        "--job-id", "--id", dest="job_id", metavar="ID", help="job id (default: job-<time>-<random>)"
    )
    source = create.add_mutually_exclusive_group()
    source.add_argument("--payload", metavar="JSON", help="the payload as JSON ('-': read stdin)")
    source.add_argument("--payload-file", metavar="FILE", help="read the JSON payload from FILE ('-': stdin)")
    create.add_argument("--max-cost-usd", type=float, metavar="USD", help="the job's cost budget")
    create.add_argument("--max-input-tokens", type=int, metavar="N", help="the job's input-token budget")
    create.add_argument(
        "--concurrency-key",
        metavar="KEY",
        help="a key whose running jobs the workers limit (AGENTLIFE_CONCURRENCY_KEY_LIMIT)",
    )
    create.add_argument(
        "--priority",
        metavar="N",
        default="0",
        help=f"{PRIORITY_MIN} to {PRIORITY_MAX}, higher is claimed first (default 0)",
    )

    show = _command(commands, "show", "the row, its crash history and its last journal events", _show)
    show.add_argument("id", metavar="ID")
    show.add_argument(
        "--events",
        type=int,
        default=DEFAULT_EVENTS,
        metavar="N",
        help=f"journal lines (default {DEFAULT_EVENTS})",
    )

    listing = _command(commands, "list", "job rows, most recently updated first", _list)
    listing.add_argument("--status", type=str.upper, choices=[str(s) for s in JobStatus], metavar="STATUS")
    listing.add_argument("--agent", metavar="AGENT_ID")
    listing.add_argument("--concurrency-key", metavar="KEY", help="only the jobs of this concurrency key")
    listing.add_argument("--limit", type=int, default=50, metavar="N", help="at most N rows (default 50)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")

    approve = _command(commands, "approve", "approve the call a job is parked on", _approve)
    approve.add_argument("id", metavar="ID")
    approve.add_argument(
        "--call",
        metavar="INVOCATION_ID",
        help="approve only if the job waits for this call (its invocation id, as `job show` prints it)",
    )
    _actor_option(approve)
    reject = _command(commands, "reject", "refuse a parked job: it ends FAILED", _reject)
    reject.add_argument("id", metavar="ID")
    reject.add_argument("--reason", default="approval rejected", help="recorded in the crash history")
    _actor_option(reject)
    cancel = _command(
        commands,
        "cancel",
        "end a job that has not finished, and its child jobs not detached: FAILED, attempt + 1",
        _batched(_cancel, "cancel"),
    )
    cancel.add_argument("id", metavar="ID", nargs="?")
    cancel.add_argument("--reason", default="cancelled by an operator", help="recorded in the crash history")
    _actor_option(cancel)
    add_selection(cancel, "cancel")
    retry = _command(commands, "retry", "run a FAILED or DEAD_LETTER job again", _batched(_retry, "retry"))
    retry.add_argument("id", metavar="ID", nargs="?")
    _actor_option(retry)
    add_selection(retry, "retry")
    pause = _command(
        commands,
        "pause",
        "pause a job: no worker runs it until `job resume`; a RUNNING job stops at its next step boundary",
        _batched(_pause, "pause"),
    )
    pause.add_argument("id", metavar="ID", nargs="?")
    pause.add_argument(
        "--reason", default=None, help="recorded with the pause (default: paused by an operator)"
    )
    _actor_option(pause)
    add_selection(pause, "pause")
    resume = _command(
        commands, "resume", "put a PAUSED job back where it was paused", _batched(_resume, "resume")
    )
    resume.add_argument("id", metavar="ID", nargs="?")
    _actor_option(resume)
    add_selection(resume, "resume")
    rewind = _command(
        commands,
        "rewind",
        "start a job again from the checkpoint it had after step N (or fork it into a new job)",
        _rewind,
    )
    rewind.add_argument("id", metavar="ID")
    rewind.add_argument("--to-step", required=True, metavar="N", help="the step whose checkpoint it resumes")
    rewind.add_argument(
        "--as", dest="as_job_id", metavar="NEW_ID", help="fork into a new job; ID is left untouched"
    )
    rewind.add_argument(
        "--yes",
        action="store_true",
        help="do it (without: print what it would do, and the side effects "
        "recorded after the step, which may happen again)",
    )
    rewind.add_argument(
        "--force", action="store_true", help="rewind a job a live worker holds: the worker is fenced out"
    )
    rewind.add_argument("--reason", default="", help="recorded in the crash history and the journal")
    rewind.add_argument("--actor", help="who rewinds it (default: user@host)")
    send = _command(commands, "send", "send an event to a job (ctx.wait_for_event takes it)", _send)
    send.add_argument("id", metavar="JOB_ID")
    send.add_argument("name", metavar="NAME", help="the event's name, as the job waits for it")
    sent = send.add_mutually_exclusive_group()
    sent.add_argument(
        "--payload",
        metavar="JSON",
        help="the event's payload as JSON ('-': read stdin); without it the payload is null, which the "
        "waiting step gets as None, as at a timeout",
    )
    sent.add_argument("--payload-file", metavar="FILE", help="read the JSON payload from FILE ('-': stdin)")
    add_prune(commands, _command, open_store)


def _command(
    commands: Any,
    name: str,
    text: str,
    handler: Callable[[argparse.Namespace], Awaitable[int]],
    *,
    must_exist: bool = True,
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=text, description=text[:1].upper() + text[1:] + "."
    )
    parser.add_argument("--database-url", help="default: AGENTLIFE_DATABASE_URL or the embedded SQLite file")
    parser.set_defaults(handler=lambda args: _main(args, handler), must_exist=must_exist)
    return parser


def _batched(single: Callable[[argparse.Namespace], Awaitable[int]], action: str) -> Any:
    """``job ACTION``'s handler: one ID as ``single`` does, or a selection (`batch_or_single`)."""
    return batch_or_single(single, action, open_store, actor_of, _masked)


def _actor_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--actor",
        type=_actor,
        default=None,
        metavar="WHO",
        help="who does this, recorded in the job's history (default: USER@HOST of this process)",
    )


def _actor(text: str) -> str:
    try:
        return check_actor(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def actor_of(args: argparse.Namespace) -> str:
    """``--actor``, else `default_actor`."""
    return getattr(args, "actor", None) or default_actor()


def _main(args: argparse.Namespace, handler: Callable[[argparse.Namespace], Awaitable[int]]) -> int:
    import anyio

    if getattr(args, "id", None) is not None:
        validate_job_id(args.id)
    try:
        return anyio.run(handler, args)
    except JobNotFound as exc:
        say(f"agentlife: {exc}")
        return ExitCode.NOT_FOUND
    except JobStateConflict as exc:
        say(f"agentlife: {exc}")
        return ExitCode.CONFLICT


async def open_store(args: argparse.Namespace) -> CheckpointStore:
    """The store of ``--database-url`` or the environment, opened.

    ``args.must_exist`` (every command but ``job create``): a SQLite file that is not there is an error
    (``no store at PATH``), never created empty.
    """
    store = store_from_url(_database_url(args), must_exist=getattr(args, "must_exist", True))
    await store.open()
    return store


def _database_url(args: argparse.Namespace) -> str:
    if args.database_url:
        validate_database_url(args.database_url, "--database-url")
    return str(args.database_url or database_url_from_env(os.environ))


async def _with_store(args: argparse.Namespace, fn: Callable[[OperatorStore], Awaitable[_T]]) -> _T:
    store = await open_store(args)
    try:
        return await fn(store)
    finally:
        await store.close()


# -- create ---------------------------------------------------------------------------------------------


async def _create(args: argparse.Namespace) -> int:
    validate_agent_id(args.agent_id)
    if args.job_id is not None:
        validate_job_id(args.job_id)
    key = validate_concurrency_key(args.concurrency_key)
    priority = parse_priority(args.priority)
    payload = _payload(args)
    agent_id, job_id = check_start(args.agent_id, payload, args.job_id, "the payload")
    budget = _budget(args.max_cost_usd, args.max_input_tokens)

    async def create(store: OperatorStore) -> JobRecord:
        return await create_job(
            store, job_id, agent_id, payload, budget, exclusive=True, concurrency_key=key, priority=priority
        )

    row = await _with_store(args, create)
    sys.stdout.write(f"{row.id}\n")
    return 0


def _payload(args: argparse.Namespace) -> Any:
    """The payload from ``--payload``, ``--payload-file`` or stdin, parsed exactly as ``run`` parses it."""
    if args.payload_file is not None:
        what = "stdin" if args.payload_file == "-" else args.payload_file
        raw = _read(args.payload_file, what)
    elif args.payload == "-":
        what, raw = "stdin", _read("-", "stdin")
    elif args.payload is not None:
        what, raw = "--payload", args.payload
    else:
        return None
    try:
        return validate_payload(_parse_payload(raw), what)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("--payload", what, 1)) from None


def _read(path: str, what: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"payload file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read the payload from {what}: {getattr(exc, 'strerror', None) or exc}"
        ) from None


def _budget(max_cost_usd: float | None, max_input_tokens: int | None) -> dict[str, Any] | None:
    budget: dict[str, Any] = {}
    if max_cost_usd is not None:
        if not (max_cost_usd > 0 and max_cost_usd < float("inf")):
            raise ConfigError(f"--max-cost-usd {max_cost_usd:g} must be a finite number > 0")
        budget["max_cost_usd"] = max_cost_usd
    if max_input_tokens is not None:
        if not 1 <= max_input_tokens <= MAX_ENV_INTEGER:
            # Past 2**53 a JSON reader may round it; past 2**64 the stores cannot write it at all.
            raise ConfigError(f"--max-input-tokens {max_input_tokens} must be >= 1 and <= {MAX_ENV_INTEGER}")
        budget["max_input_tokens"] = max_input_tokens
    return budget or None


# -- show, list -----------------------------------------------------------------------------------------


async def _show(args: argparse.Namespace) -> int:
    if args.events < 0:
        raise ConfigError(f"--events {args.events} must be >= 0")
    masker = masker_for(os.environ, _database_url(args))
    state = await _with_store(args, lambda store: read_job_state(store, args.id))
    if state is None:
        raise JobNotFound(await _with_store(args, lambda store: missing_job(store, args.id)))
    # The same view the console draws, masked by the same masker: a terminal is no place for a secret.
    shown = show_job(state, masker)
    row = shown.row
    out = [
        f"job {row.id}",
        f"  agent       {row.agent_id}",
        f"  status      {row.status}",
        f"  attempt     {row.attempt}",
        f"  updated     {utc(row.updated_at)}",
        f"  heartbeat   {utc(row.heartbeat_at)}",
    ]
    if row.not_before is not None and row.status == JobStatus.RETRYING:
        out.append(f"  not before  {utc(row.not_before)}")
    if row.concurrency_key is not None:
        out.append(f"  key         {row.concurrency_key}")
    out.append(f"  priority    {row.priority}")
    unreadable = {name: _unreadable(row, name) for name in JSON_COLUMNS}
    budget = to_json(row.token_budget) if row.token_budget else "-"
    out += [
        f"  checkpoint  {row.checkpoint_id or '-'}",
        f"  tokens      {unreadable['tokens_consumed'] or to_json(row.tokens_consumed)}",
        f"  budget      {unreadable['token_budget'] or budget}",
        f"  payload     {unreadable['payload'] or to_json(row.payload)}",
    ]
    if row.result is not None or unreadable["result"]:
        out.append(f"  result      {unreadable['result'] or to_json(row.result)}")
    out += [f"  {line}" for line in shown.waits_for]
    out += [masker.text(line) for line in await _family_lines(args, state.row.id)]
    out.append(f"crash history ({len(state.row.error)})")
    out += [f"  {line}" for line in shown.history] or ["  (none)"]
    out += [masker.text(line) for line in _journal_tail(args.id, args.events)]
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def _unreadable(row: JobRecord, column: str) -> str:
    """``(unreadable: why)`` for a column the store could not decode, else the empty string."""
    why = row.unreadable.get(column)
    return f"(unreadable: {why})" if why else ""


async def _family_lines(args: argparse.Namespace, job_id: str) -> list[str]:
    """The job's parent, and the children it started, when it has any."""
    try:
        family = await _with_store(args, lambda store: store.get_family(job_id))
    except StoreError:  # a PostgreSQL table that predates child jobs (``db init`` adds the columns)
        return []
    if family is None:
        return []
    out = []
    if family.parent_id is not None:
        detached = ", detached" if family.detached else ""
        out.append(f"  parent      {family.parent_id} ({family.spawned_by}{detached})")
    if family.children:
        shown = [f"{c} {status}" for c, status, _ in family.children[:SHOWN_CHILDREN]]
        out.append(f"  children    {', '.join(shown)}{more(len(family.children))}")
    return out


def _journal_tail(job_id: str, count: int) -> list[str]:
    """The last ``count`` lines of the job's newest session timeline, when the data dir holds its journal."""
    if count == 0:
        return []
    session_dir = Path(os.environ.get("AGENTLIFE_DATA_DIR") or ".agentlife") / "sessions" / job_id
    sessions = list_sessions(session_dir)
    if not sessions:
        return [f"journal: none under {session_dir}"]
    try:
        lines = format_timeline(sessions[-1]).splitlines()
    except ConfigError as exc:
        return [f"journal: {exc}"]
    plural = "s" if len(sessions) != 1 else ""
    out = [f"journal {sessions[-1]} ({len(sessions)} session{plural})"]
    out += [f"  {line}" for line in lines[1:2]]  # started ...; N events; how it ended
    out += [f"  {line}" for line in [line for line in lines[3:] if line.strip()][-count:]]
    return out


async def _list(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= MAX_LIMIT:
        raise ConfigError(f"--limit {args.limit} must be >= 1 and <= {MAX_LIMIT}")
    key = validate_concurrency_key(args.concurrency_key)
    rows = await _with_store(
        args, lambda store: store.list_jobs(args.status, args.agent, args.limit, concurrency_key=key)
    )
    if args.json:  # the rows as stored, for scripts: bytes another client wrote as hex, never a crash
        for row in rows:
            sys.stdout.write(json.dumps(_as_json(row), sort_keys=True, default=_stored_bytes) + "\n")
        return 0
    mask = _masked(args)  # the table masks what `job show` masks: an id or agent id can hold a key
    table: list[tuple[str, ...]] = [
        ("ID", "AGENT", "STATUS", "ATTEMPT", "UPDATED", "CRASHES", "PRIORITY", "KEY")
    ]
    for row in rows:
        crashes = sum(1 for entry in row.error if is_crash(entry))
        cells = (
            *(row.id, row.agent_id, row.status, str(row.attempt), utc(row.updated_at), str(crashes)),
            *(str(row.priority), row.concurrency_key or "-"),
        )
        table.append(tuple(mask(cell) for cell in cells))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        sys.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() + "\n")
    return 0


def _masked(args: argparse.Namespace) -> Callable[[str], str]:
    """What the commands print about a job goes through the masker `job show` uses."""
    masker = masker_for(os.environ, _database_url(args))
    return lambda text: masker.text(text, 20_000)


def _stored_bytes(value: object) -> str:
    """A BLOB another client wrote where JSON was expected, in `job list --json`: its bytes in hex."""
    if isinstance(value, bytes | bytearray | memoryview):
        return "hex:" + bytes(value).hex()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _as_json(row: JobRecord) -> dict[str, Any]:
    return {
        "id": row.id,
        "agent_id": row.agent_id,
        "status": row.status,
        "attempt": row.attempt,
        "payload": row.payload,
        "heartbeat_at": row.heartbeat_at,
        "updated_at": row.updated_at,
        "not_before": row.not_before,
        "checkpoint_id": row.checkpoint_id,
        "tokens_consumed": row.tokens_consumed,
        "token_budget": row.token_budget,
        "error": row.error,
        "result": row.result,
        "unreadable": row.unreadable,
        "concurrency_key": row.concurrency_key,
        "priority": row.priority,
    }


# -- approve, reject, cancel, retry ---------------------------------------------------------------------


async def _approve(args: argparse.Namespace) -> int:
    row, request = await _with_store(
        args, lambda store: approve_parked(store, args.id, args.call, actor=actor_of(args))
    )
    how = "the parked process takes it" if row.status == JobStatus.RUNNING else "the next run resumes it"
    what = call_text(request) if request is not None else "no call recorded: the job asks again, naming it"
    sys.stdout.write(_masked(args)(f"job {row.id} approved: {row.status} ({how}): {what}") + "\n")
    return 0


async def _reject(args: argparse.Namespace) -> int:
    row = await _with_store(args, lambda store: store.reject(args.id, args.reason, actor=actor_of(args)))
    sys.stdout.write(_masked(args)(f"job {row.id} rejected: {row.status}") + "\n")
    return 0


async def _cancel(args: argparse.Namespace) -> int:
    actor = actor_of(args)
    row, children = await _with_store(
        args, lambda store: cancel_with_children(store, args.id, args.reason, actor=actor)
    )
    mask = _masked(args)
    said = f"job {row.id} cancelled: {row.status}, attempt {row.attempt}"
    sys.stdout.write(mask(said) + " (a process still running it is fenced out)\n")
    for child in children:
        sys.stdout.write(
            mask(f"  child job {child.id} cancelled: {child.status}, attempt {child.attempt}") + "\n"
        )
    return 0


async def _retry(args: argparse.Namespace) -> int:
    row = await _with_store(args, lambda store: store.retry(args.id, actor=actor_of(args)))
    sys.stdout.write(
        _masked(args)(f"job {row.id} will run again: {row.status}, attempt {row.attempt}") + "\n"
    )
    return 0


async def _pause(args: argparse.Namespace) -> int:
    row = await _with_store(args, lambda store: pause_job(store, args.id, args.reason, args.actor))
    if row.status == JobStatus.PAUSED:
        said = f"job {row.id} paused: PAUSED (resume puts it back {_paused_from(row)})"
    else:
        said = f"job {row.id} pause requested: it is {row.status} and stops at its next step boundary"
    sys.stdout.write(_masked(args)(said) + "\n")
    return 0


async def _resume(args: argparse.Namespace) -> int:
    row = await _with_store(args, lambda store: resume_job(store, args.id, args.actor))
    if row.status == JobStatus.RUNNING:
        said = f"job {row.id}: its pause request is withdrawn, it goes on RUNNING"
    else:
        said = f"job {row.id} resumed: {row.status}"
    sys.stdout.write(_masked(args)(said) + "\n")
    return 0


def _paused_from(row: JobRecord) -> str:
    for entry in reversed(row.error):
        if isinstance(entry, dict) and entry.get("error_class") == "Paused":
            return f"as {entry.get('paused_from')}"
    return "where it was"


async def _rewind(args: argparse.Namespace) -> int:
    step = parse_step(args.to_step)  # usage errors before the store is opened
    try:
        actor = default_actor() if args.actor is None else check_actor(args.actor)
    except ValueError as exc:
        raise ConfigError(f"--actor: {exc}") from None
    if args.reason:
        check_reason(args.reason)
    if args.as_job_id is not None:
        validate_job_id(args.as_job_id)
    mask = _masked(args)

    async def run(store: OperatorStore) -> int:
        plan = await plan_rewind(store, args.id, step)
        _print_rewind_plan(plan, args.as_job_id, mask)
        if not args.yes:
            say(f"agentlife: job {args.id} not rewound: run again with --yes to rewind it")
            return int(ExitCode.USAGE)
        row = await rewind_job(
            store, plan, actor=actor, reason=args.reason, force=args.force, as_job_id=args.as_job_id
        )
        if args.as_job_id is not None:
            said = f"job {row.id} created from job {args.id} at step {step}: {row.status}"
        else:
            said = f"job {row.id} rewound to step {step}: {row.status}, attempt {row.attempt}"
        sys.stdout.write(mask(said) + "\n")
        return 0

    return await _with_store(args, run)


def _print_rewind_plan(plan: RewindPlan, as_job_id: str | None, mask: Callable[[str], str]) -> None:
    """What the rewind does, and the side effects recorded after the step, for the operator to confirm."""
    job, step = plan.job, plan.target.to_step
    now = f"job {job.id} (now {job.status}, attempt {job.attempt})"
    where = f"a new job {as_job_id} from {now}" if as_job_id else now
    lines = [f"rewind {where} to the checkpoint after step {step}: steps after {step} run again"]
    if as_job_id is None:
        lines.append(f"  (steps {', '.join(str(s) for s in plan.reachable)} are within reach)")
    if plan.effects:
        lines.append(f"side effects recorded after step {step}, which may happen again:")
        for effect in plan.effects:
            at = "?" if effect.at is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(effect.at))
            done = "completed" if effect.completed else "started, outcome unknown"
            lines.append(f"  step {effect.step}  {effect.tool}  {effect.invocation_id}  {at}  ({done})")
    else:
        lines.append(f"no side effect recorded after step {step}")
    for line in lines:
        sys.stdout.write(mask(line) + "\n")


async def _send(args: argparse.Namespace) -> int:
    payload = _payload(args)
    check_event(args.name, payload)  # a bad name or payload is a usage error before the store is opened
    seq = await _with_store(args, lambda store: store.send_event(args.id, args.name, payload))
    sys.stdout.write(_masked(args)(f"event {args.name!r} sent to job {args.id} (#{seq})") + "\n")
    if args.payload is None and args.payload_file is None:
        sys.stderr.write(
            "agentlife: note: sent without --payload, the event carries null: ctx.wait_for_event returns it "
            "as None, which is also what it returns at a timeout\n"
        )
    return 0
