"""What a SQL database supplies so that the store's operations, each written once, run on it.

An operation is an ``async def op(tx, ...)`` in the module of its concern (`_claims`, `_checkpoints`,
`_jobs`, `_approval`, `_waits`, `_events`, `_childjobs`, `_steprecords`, `_delivery`), written against `Tx`:
``fetch``, ``fetchrow``, ``fetchval`` and ``execute`` (which returns how many rows the statement changed or
found), ``atomic()`` for a transaction, ``now`` (the clock), ``job(row)`` (a job row as a `JobRecord`) and
``sql``, the database's `Statements`. A statement names its parameters (``:job_id``); the operation passes
them by name, every one that any database's statement may use, and each statement takes those it names.

A database supplies:

- its `Statements`: the ones most SQL databases write alike are built once (`shared_statements`) from a
  few spellings of its `Dialect` (the clock, ``FOR UPDATE``, a list parameter, JSON and time casts); the
  others it writes itself, where it has a construct the others lack (PostgreSQL's ``RETURNING``,
  data-modifying CTEs, ``SKIP LOCKED``, ``NOTIFY``) or reads a row its own way;
- a `Tx` over one connection, with its row decoding;
- a `Database`: the connection or pool, the schema, and ``run(op, ...)``, which hands an operation a `Tx`
  and maps the driver's errors to `agentlife.StoreUnavailable` and `agentlife.StoreError`.

Where a database lacks a construct another uses in one statement, its statement may be one of the composite
forms below, which its `Tx` runs as several statements in one transaction (SQLite, for instance, before
version 3.35 has no ``RETURNING``): `Chain`, `Guarded`, `Many`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from agentlife.stores._base import JobRecord, TableNames
from agentlife.stores._jobs import RUNNABLE, SETTLES_PAUSE, TERMINAL

__all__ = [
    "RUNNABLE_LIST",
    "SETTLES_PAUSE_SQL",
    "Chain",
    "Database",
    "Dialect",
    "Guarded",
    "Many",
    "Row",
    "SlotTaken",
    "Sql",
    "Statement",
    "Statements",
    "Tx",
    "shared_statements",
]

P = ParamSpec("P")
T = TypeVar("T")

#: A parameter in a statement's text: ``:name``, never the ``::`` of a cast.
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
#: The SQL list of the statuses a worker may claim once due, and of those no late writer may change.
RUNNABLE_SQL = f"status IN ({', '.join(repr(str(s)) for s in RUNNABLE)})"
#: The SQL list of the runnable statuses, and of those a requested pause turns into PAUSED.
RUNNABLE_LIST = ", ".join(repr(str(s)) for s in RUNNABLE)
SETTLES_PAUSE_SQL = ", ".join(repr(str(s)) for s in SETTLES_PAUSE)
TERMINAL_SQL = ", ".join(repr(str(s)) for s in TERMINAL)


class SlotTaken(Exception):
    """A claim's running slot (of a concurrency key or an agent) was taken first by a concurrent claim.

    The unique index on the RUNNING rows' slots refused it, and nothing was written: claim again.
    """


@dataclass(frozen=True, slots=True)
class Sql:
    """One statement, in the text its driver takes, and the names of its parameters in the driver's order."""

    text: str
    names: tuple[str, ...]

    @classmethod
    def named(cls, text: str) -> Sql:
        """A statement whose driver takes ``:name`` parameters as they are (sqlite3)."""
        return cls(text, tuple(dict.fromkeys(_PARAM.findall(text))))

    @classmethod
    def numbered(cls, text: str) -> Sql:
        """A statement whose driver takes ``$1``, ``$2`` ... (asyncpg): each name becomes its number."""
        names: dict[str, int] = {}

        def number(match: re.Match[str]) -> str:
            return f"${names.setdefault(match.group(1), len(names) + 1)}"

        return cls(_PARAM.sub(number, text), tuple(names))

    def values(self, params: dict[str, Any]) -> list[Any]:
        """The parameters' values in the driver's order (`KeyError` names one the operation did not pass)."""
        return [params[name] for name in self.names]


@dataclass(frozen=True, slots=True)
class Chain:
    """Statements run in turn, each with the columns of the row the one before it returned as parameters.

    A statement that returns no row, or changes none, ends the chain with no result; otherwise the result is
    the last statement's. Run in one transaction. It stands for ``UPDATE ... RETURNING`` (the update, then
    a select of the row) and ``WITH picked AS (SELECT ... LIMIT 1) UPDATE ... RETURNING`` (a select of the
    key, the update, the select) where a database has no ``RETURNING``.
    """

    steps: tuple[Sql, ...]


@dataclass(frozen=True, slots=True)
class Many:
    """One statement run once per element of the list parameters ``over``, taken in step.

    It stands for ``INSERT ... SELECT ... FROM unnest(:a, :b)``.
    """

    sql: Sql
    over: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Guarded:
    """``guard``, then the statements ``then`` only if it found or changed a row; the guard's result.

    Run in one transaction. It stands for a data-modifying CTE whose other parts run
    ``WHERE EXISTS (SELECT 1 FROM guard)``.
    """

    guard: Sql
    then: tuple[Sql | Many, ...]


#: What a `Tx` runs: one statement, or one of the composite forms of a database that lacks a construct.
Statement = Sql | Chain | Guarded | Many


class Row(Protocol):
    """A result row: its columns by position or by name, or in order (``sqlite3.Row``, ``asyncpg.Record``)."""

    def __getitem__(self, key: int | str, /) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


#: ``(status filtered, agent filtered, the cursor)`` -> the page statement and the cursor's parameters.
Page = Callable[
    [bool, bool, "tuple[Any, str | bytes | None] | None", bool], "tuple[Statement, dict[str, Any]]"
]
#: ``(conversation rows, step records, a prune, usage, flushed)``: what one checkpoint write carries, and
#: whether its commit waits for the database's log flush (see `write_checkpoint`).
CheckpointShape = tuple[bool, bool, bool, bool, bool]


class Statements:
    """Every statement of the store's operations, in one database's dialect, built once per table layout.

    The parameters each takes are those the operation that runs it passes (see the operation). Built by
    `shared_statements` and the database's own; a missing or unknown one fails at construction, and none
    changes after it. (Not a dataclass: generating its methods for this many fields cost every process
    ~10 ms at import.)
    """

    def __init__(self, **statements: Any) -> None:
        names = frozenset(type(self).__annotations__)
        missing, unknown = sorted(names - statements.keys()), sorted(statements.keys() - names)
        if missing or unknown:
            raise TypeError(f"Statements: missing {missing}, unknown {unknown}")
        for name, statement in statements.items():
            object.__setattr__(self, name, statement)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Statements are built once: {name} cannot be set")

    # -- job rows and claims (_claims)
    get_job: Statement
    create_job: Statement
    lock_claim: Statement
    take_claim: Statement
    claim_any: Statement
    claim_agent: Statement
    set_aside: Statement
    count_runnable: Statement
    # -- the operator's overview (_overview)
    overview_counts: Statement
    overview_runnable: Statement
    overview_stale: Statement
    overview_stale_rows: Statement
    overview_ended: Statement
    release: Statement
    drop_claim: Statement
    release_claims: Statement
    set_status: Statement
    fenced_status: Statement
    lock_usage: Statement
    write_usage: Statement
    heartbeat: Statement
    page: Page
    claim_limited: Callable[[bool, bool, bool], Statement]
    """The claim with running limits: of one agent's jobs or any agent's, with key limits, with an agent
    limit (`_claims.claim_next`)."""
    keys: bool
    """Whether the job table has the columns of concurrency keys (PostgreSQL adds them at ``db init``)."""
    # -- checkpoints and the conversation (_checkpoints)
    load: Statement
    history: Statement
    load_messages: Statement
    checkpoint: Callable[[CheckpointShape], Statement]
    # -- operator transitions and the reaper (_jobs)
    lock_row: Statement
    approve: Statement
    reject: Statement
    cancel: Statement
    retry: Statement
    pause: Statement
    resume: Statement
    settle_pause: Statement
    pause_requested: Statement
    clock: Statement
    stale: Statement
    owned_here: Statement
    lock_stale: Statement
    lock_owned: Statement
    agent_errors: Statement
    reap: Statement
    # -- approvals (_approval)
    lock_approval: Statement
    park_approval: Statement
    get_approval: Statement
    # -- durable waits (_waits)
    lock_job: Statement
    event_sent: Statement
    park: Statement
    get_wait: Statement
    # -- events (_events)
    lock_wait: Statement
    count_kept: Statement
    insert_event: Statement
    wake: Statement
    lock_attempt: Statement
    event_taken: Statement
    take_event: Statement
    set_event_aside: Statement
    kept_events: Statement
    # -- child jobs (_childjobs)
    start_child: Statement
    origin: Statement
    children_ended: Statement
    child_rows: Statement
    family: Statement
    children: Statement
    # -- step records (_steprecords)
    append_records: Statement
    load_records: Statement
    # -- rewinding a job to a step (_rewind)
    rewind_job: Statement
    rewind_add_history: Statement
    rewind_cut_history: Statement
    rewind_cut_records: Statement
    rewind_cut_messages: Statement
    fork_job: Statement
    fork_messages: Statement
    # -- a job's output (_output, statements in _output_sql)
    lock_publisher: Statement
    published_by: Statement
    output_head: Statement
    insert_output: Statement
    output_job_head: Statement
    read_output: Statement
    send_deltas: Statement
    delta_head: Statement
    read_deltas: Statement
    unsynced_on: Statement | None
    unsynced_off: Statement | None
    # -- the delivery registry (_delivery)
    is_delivered: Statement
    record_delivery: Statement
    # -- rate-limit buckets (_ratebuckets)
    rate_insert_bucket: Statement
    rate_lock_bucket: Statement
    rate_get_bucket: Statement
    rate_write_bucket: Statement
    rate_expire_slots: Statement
    rate_count_slots: Statement
    rate_live_slots: Statement
    rate_take_slot: Statement
    rate_end_slot: Statement
    # -- retention (_prune)
    prune_pick: dict[tuple[bool, bool], Statement]
    """The finished rows to prune, oldest first: (an agent filter, locked for the batch)."""
    prune_count: dict[bool, Statement]
    prune_rows: tuple[Statement, ...]
    """The deletes of a job's rows in every other table, run before the job rows' own."""
    prune_tombstone: Statement
    prune_jobs: Statement
    prune_tombstones: Statement
    pruned_job: Statement
    pruned_among: Statement
    """Of a list of ids, those with a tombstone and no row."""


class Dialect(Protocol):
    """How a database spells the few things SQL databases write differently, for `shared_statements`."""

    #: The statement's clock as a SQL expression (``now()``, or ``:now`` where the `Tx` passes it).
    now: str
    #: What locks the rows a SELECT read until the transaction ends (`` FOR UPDATE``, or nothing).
    for_update: str
    #: The claim-token fence, after ``attempt = :attempt`` (nothing on a table without an ``owner`` column).
    fence: str

    def sql(self, text: str) -> Sql:
        """The statement in its driver's parameter style."""
        ...

    def in_list(self, column: str, param: str, sql_type: str) -> str:
        """``column`` is one of the list parameter ``param`` (of elements of ``sql_type``)."""
        ...

    def json(self, param: str) -> str:
        """The parameter ``param`` (JSON text) as a JSON column's value."""
        ...

    def epoch(self, column: str) -> str:
        """A time column as unix seconds."""
        ...

    def time(self, param: str) -> str:
        """The parameter ``param`` (unix seconds) as a time column's value."""
        ...

    def raw(self, column: str) -> str:
        """A column read as stored, whatever its bytes (``CAST(c AS BLOB)`` where text may not be text)."""
        ...


def shared_statements(t: TableNames, d: Dialect) -> dict[str, Statement]:
    """The statements most SQL databases write alike, in ``d``'s spelling."""
    j, event, records = t.job, t.event, t.step_record
    fenced = f"id = :job_id AND attempt = :attempt{d.fence}"
    text = {
        "drop_claim": f"UPDATE {j} SET owner = NULL WHERE id = :job_id AND owner = :owner",
        "release_claims": (
            f"UPDATE {j} SET owner = NULL WHERE owner = :owner AND {d.in_list('id', 'job_ids', 'text')}"
        ),
        "fenced_status": f"SELECT status FROM {j} WHERE {fenced}",
        "lock_usage": f"SELECT tokens_consumed FROM {j} WHERE {fenced}{d.for_update}",
        "write_usage": (
            f"UPDATE {j} SET tokens_consumed = {d.json('totals')}, updated_at = {d.now} WHERE id = :job_id"
        ),
        "heartbeat": f"UPDATE {j} SET heartbeat_at = {d.now} WHERE {fenced}",
        "count_runnable": (
            f"SELECT {d.raw('agent_id')}, count(*) FROM {j}"
            f" WHERE {RUNNABLE_SQL} AND (not_before IS NULL OR not_before <= {d.now}) GROUP BY agent_id"
        ),
        **_overview_statements(j, d),
        "load": f"SELECT checkpoint, checkpoint_crc, checkpoint_id FROM {j} WHERE id = :job_id",
        "history": (
            f"SELECT checkpoint_id, checkpoint, crc, step FROM {t.checkpoint_history} WHERE job_id = :job_id"
            " ORDER BY created_at DESC, step DESC"
        ),
        "load_messages": (
            f"SELECT message FROM {t.conversation} WHERE job_id = :job_id AND seq < :length ORDER BY seq"
        ),
        "agent_errors": (
            f"SELECT {d.raw('error')} FROM {j} WHERE agent_id = :agent_id AND updated_at >= {d.time('since')}"
        ),
        "lock_approval": f"SELECT status, approval FROM {j} WHERE {fenced}{d.for_update}",
        "park_approval": (
            f"UPDATE {j} SET status = :status, approval = {d.json('approval')}, updated_at = {d.now}"
            " WHERE id = :job_id"
        ),
        "get_approval": f"SELECT status, approval FROM {j} WHERE id = :job_id",
        "lock_job": f"SELECT 1 FROM {j} WHERE id = :job_id{d.for_update}",
        "event_sent": (
            f"SELECT 1 FROM {event} WHERE job_id = :job_id AND taken_by IS NULL"
            f" AND {d.in_list('name', 'names', 'text')} LIMIT 1"
        ),
        "get_wait": f"SELECT status, {d.epoch('not_before')} AS until, waiting FROM {j} WHERE id = :job_id",
        "lock_wait": f"SELECT status, waiting FROM {j} WHERE id = :job_id{d.for_update}",
        "count_kept": f"SELECT count(*) FROM {event} WHERE job_id = :job_id AND taken_by IS NULL",
        "lock_attempt": f"SELECT attempt FROM {j} WHERE id = :job_id{d.for_update}",
        "event_taken": (
            f"SELECT name, payload FROM {event} WHERE job_id = :job_id AND taken_by = :invocation_id"
        ),
        "set_event_aside": (
            f"UPDATE {event} SET taken_by = :mark WHERE job_id = :job_id AND taken_by = :invocation_id"
        ),
        "kept_events": (
            f"SELECT name, count(*) FROM {event} WHERE job_id = :job_id AND taken_by IS NULL"
            " GROUP BY name ORDER BY min(seq)"
        ),
        "origin": f"SELECT agent_id, parent_id, spawned_by FROM {j} WHERE id = :job_id",
        "children_ended": (
            f"SELECT count(*) FROM {j} WHERE {d.in_list('id', 'job_ids', 'text')}"
            f" AND status IN ({TERMINAL_SQL})"
        ),
        "child_rows": (
            f"SELECT id, parent_id, status, {d.raw('result')} AS result, {d.raw('error')} AS error,"
            f" {d.epoch('updated_at')} AS ended_at FROM {j} WHERE {d.in_list('id', 'job_ids', 'text')}"
        ),
        "family": f"SELECT parent_id, spawned_by, detached FROM {j} WHERE id = :job_id",
        "children": f"SELECT id, status, detached FROM {j} WHERE parent_id = :job_id ORDER BY id",
        "load_records": (
            f"SELECT step, attempt, session, seq, data FROM {records} WHERE job_id = :job_id"
            " ORDER BY attempt, session, seq"
        ),
        "is_delivered": f"SELECT 1 FROM {t.delivery} WHERE key = :key",
        **_rewind_statements(t, d),
        **_rate_statements(t, d),
    }
    return {name: d.sql(statement) for name, statement in text.items()}


def _rewind_statements(t: TableNames, d: Dialect) -> dict[str, str]:
    """Rewinding a job to a step's checkpoint, in place or into a new job (`agentlife.stores._rewind`)."""
    j, h = t.job, t.checkpoint_history
    return {
        # (rewind_job, the row's update, is each database's own: PostgreSQL frees slots and notifies.)
        "rewind_add_history": (
            f"INSERT INTO {h} (job_id, checkpoint_id, step, checkpoint, crc, created_at)"
            f" VALUES (:job_id, :checkpoint_id, :step, :data, :crc, {d.now})"
        ),
        "rewind_cut_history": f"DELETE FROM {h} WHERE job_id = :job_id AND step > :step",
        "rewind_cut_records": f"DELETE FROM {t.step_record} WHERE job_id = :job_id AND step > :step",
        "rewind_cut_messages": f"DELETE FROM {t.conversation} WHERE job_id = :job_id AND seq >= :length",
        # A new row with the source's agent, payload and budget; an existing id, or one whose job was
        # pruned (its tombstone: a create retried after the prune must not run it again), changes nothing.
        "fork_job": (
            f"INSERT INTO {j} (id, agent_id, status, payload, attempt, token_budget, updated_at, not_before,"
            " checkpoint, checkpoint_crc, checkpoint_id, error)"
            f" SELECT :new_id, agent_id, 'PENDING', payload, 0, token_budget, {d.now}, {d.now}, :data, :crc,"
            f" :checkpoint_id, {d.json('history')} FROM {j} WHERE id = :job_id"
            f" AND NOT EXISTS (SELECT 1 FROM {t.pruned} WHERE id = :new_id) ON CONFLICT (id) DO NOTHING"
        ),
        "fork_messages": (
            f"INSERT INTO {t.conversation} (job_id, seq, step, message) SELECT :new_id, seq, step, message"
            f" FROM {t.conversation} WHERE job_id = :job_id AND seq < :length"
        ),
    }


def _rate_statements(t: TableNames, d: Dialect) -> dict[str, str]:
    """The rate-limit buckets' statements (`agentlife.stores._ratebuckets`): plain SQL on every database."""
    bucket, slot = t.rate_bucket, t.rate_slot
    columns = "requests, input_tokens, output_tokens, updated_at, paused_until"
    return {
        "rate_insert_bucket": (
            f"INSERT INTO {bucket} (key, {columns}) VALUES"
            " (:key, :requests, :input_tokens, :output_tokens, :at, 0) ON CONFLICT (key) DO NOTHING"
        ),
        "rate_lock_bucket": f"SELECT {columns} FROM {bucket} WHERE key = :key{d.for_update}",
        "rate_get_bucket": f"SELECT {columns} FROM {bucket} WHERE key = :key",
        "rate_write_bucket": (
            f"UPDATE {bucket} SET requests = :requests, input_tokens = :input_tokens,"
            " output_tokens = :output_tokens, updated_at = :at, paused_until = :paused_until WHERE key = :key"
        ),
        "rate_expire_slots": f"DELETE FROM {slot} WHERE key = :key AND expires_at <= :at",
        "rate_count_slots": f"SELECT count(*) FROM {slot} WHERE key = :key",
        "rate_live_slots": f"SELECT count(*) FROM {slot} WHERE key = :key AND expires_at > :at",
        "rate_take_slot": f"INSERT INTO {slot} (id, key, expires_at) VALUES (:id, :key, :until)",
        "rate_end_slot": f"DELETE FROM {slot} WHERE id = :id",
    }


class Tx(Protocol):
    """One connection of the store's database, as an operation sees it.

    The statement methods take the statement and its parameters by name; ``now`` (this transaction's
    clock, unix seconds, read when the operation began) is passed to a statement that names ``:now``.
    """

    @property
    def sql(self) -> Statements:
        """The database's statements."""
        ...

    @property
    def now(self) -> float:
        """Unix time when the operation began: the clock of what it writes in JSON (and of SQLite's rows)."""
        ...

    def atomic(self) -> AbstractAsyncContextManager[object]:
        """A transaction: what runs inside commits together or not at all, and a write lock is held."""
        ...

    def job(self, row: Row) -> JobRecord:
        """A job row (the columns of ``get_job``) as a `JobRecord`; a column it cannot read is named in it."""
        ...

    async def fetch(self, statement: Statement, **params: Any) -> Sequence[Row]:
        """Every row the statement returns."""
        ...

    async def fetchrow(self, statement: Statement, **params: Any) -> Row | None:
        """The first row the statement returns, or None."""
        ...

    async def fetchval(self, statement: Statement, **params: Any) -> Any:
        """The first column of the first row, or None."""
        ...

    async def execute(self, statement: Statement, **params: Any) -> int:
        """Run the statement; how many rows it changed (or returned)."""
        ...


#: An operation: a coroutine over a `Tx` and its arguments.
Op = Callable[Concatenate[Tx, P], Coroutine[Any, Any, T]]


class Database(Protocol):
    """The store's database: its connection or pool, its schema, and the runner of operations."""

    async def open(self) -> None:
        """Connect; `agentlife.StoreUnavailable` when it cannot be reached."""
        ...

    async def close(self) -> None:
        """Release the connections; safe to call twice and after a failed `open`."""
        ...

    async def init_schema(self) -> None:
        """Create what is missing of the schema."""
        ...

    def has_free_connection(self) -> bool:
        """Whether a statement could start now (safe to call from another thread)."""
        ...

    async def run(self, op: Op[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``op`` on a connection; the driver's errors become `StoreUnavailable` or `StoreError`."""
        ...


def _overview_statements(j: str, d: Dialect) -> dict[str, str]:
    """The overview's reads (`_overview.job_overview`): each an index range of the job table, bounded."""
    stale = f"status = :status AND (heartbeat_at IS NULL OR heartbeat_at < {d.time('stale_before')})"
    # Runnable since: the later of when it came due and when its row last changed (a due retry waits
    # from its not_before, a new job from its creation).
    since = "CASE WHEN not_before IS NOT NULL AND not_before > updated_at THEN not_before ELSE updated_at END"
    return {
        "overview_counts": (
            f"SELECT status, {d.raw('agent_id')}, count(*) FROM {j} GROUP BY status, agent_id"
            " ORDER BY status, agent_id LIMIT :limit"
        ),
        "overview_runnable": (
            f"SELECT count(*), min({d.epoch(since)}) FROM {j}"
            f" WHERE {RUNNABLE_SQL} AND (not_before IS NULL OR not_before <= {d.now})"
        ),
        "overview_stale": f"SELECT count(*) FROM {j} WHERE {stale}",
        "overview_stale_rows": (
            f"SELECT {d.raw('id')}, {d.epoch('heartbeat_at')} FROM {j} WHERE {stale}"
            " ORDER BY heartbeat_at LIMIT :limit"
        ),
        "overview_ended": (
            f"SELECT status, count(*) FROM {j} WHERE status IN ({TERMINAL_SQL})"
            f" AND updated_at >= {d.time('since')} GROUP BY status"
        ),
    }
