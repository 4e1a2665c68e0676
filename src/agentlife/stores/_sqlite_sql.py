"""SQLite's statements for the store's operations, and how it reads a job row that another client wrote.

SQLite has no server clock shared by its clients, so a statement takes the transaction's clock as
``:now`` (unix seconds, `SQLiteTx.now`). It has no ``FOR UPDATE``: an operation that must not race
runs in a ``BEGIN IMMEDIATE`` transaction, whose write lock serialises every writer of the file. Where
PostgreSQL writes ``RETURNING``, a data-modifying CTE or ``unnest``, SQLite runs a `Chain`, `Guarded` or
`Many` of plain statements in one transaction (``RETURNING`` needs SQLite 3.35). A list parameter is bound as
JSON text and read with ``json_each``.

Rows are read with their text columns as bytes (``CAST(... AS BLOB)``): SQLite keeps whatever another client
wrote, and text that is not UTF-8 would make sqlite3 raise on the fetch itself. `sqlite_job` decodes them
and names what it cannot read (`JobRecord.unreadable`), so one bad row never stops a reader.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from agentlife.stores._base import HISTORY_KEEP, JobRecord, TableNames
from agentlife.stores._dialect import (
    RUNNABLE_SQL,
    SETTLES_PAUSE_SQL,
    TERMINAL_SQL,
    Chain,
    Guarded,
    Many,
    Row,
    Sql,
    Statement,
    Statements,
    shared_statements,
)
from agentlife.stores._output_sql import sqlite_output_statements
from agentlife.stores._prune import prune_statements
from agentlife.stores._rows import JSON_COLUMNS, SET_ASIDE_STATUS, job_record

__all__ = ["SQLITE", "sqlite_job", "sqlite_statements"]

_TEXT_COLUMNS = ("id", "agent_id", "status")
#: A job row as `sqlite_job` reads it: text and JSON columns as bytes (under names of their own, so that an
#: ORDER BY names the stored column, not its bytes), and the type of the stored id.
JOB_SELECT = ", ".join(
    [
        *(f"CAST({name} AS BLOB) AS raw_{name}" for name in _TEXT_COLUMNS),
        "attempt, checkpoint_id, checkpoint_crc, heartbeat_at, updated_at, not_before",
        *(f"CAST({name} AS BLOB) AS raw_{name}" for name in JSON_COLUMNS),
        "CAST(concurrency_key AS BLOB) AS raw_concurrency_key, priority, incarnation",
        "typeof(id) AS id_type",
    ]
)
#: The columns of `JOB_SELECT` before ``id_type``, in order, as `job_record` names them.
_JOB_NAMES = (
    *_TEXT_COLUMNS,
    "attempt",
    "checkpoint_id",
    "checkpoint_crc",
    "heartbeat_at",
    "updated_at",
    "not_before",
    *JSON_COLUMNS,
    "concurrency_key",
    "priority",
    "incarnation",
)
#: What a claim makes of the row's status: a runnable row (a parked wait's too) is RUNNING, others stay.
CLAIMED_STATUS = "CASE WHEN status IN ('PENDING', 'RETRYING', 'WAITING') THEN 'RUNNING' ELSE status END"
_LIVE = f"status NOT IN ({TERMINAL_SQL})"
_DUE = "(not_before IS NULL OR not_before <= :now)"


class _SQLite:
    """SQLite's spelling of what SQL databases write differently (a `Dialect`)."""

    now = ":now"
    for_update = ""
    fence = " AND (owner IS NULL OR owner = :owner)"

    def sql(self, text: str) -> Sql:
        return Sql.named(text)

    def in_list(self, column: str, param: str, sql_type: str) -> str:
        return f"{column} IN (SELECT value FROM json_each(:{param}))"

    def json(self, param: str) -> str:
        return f":{param}"

    def epoch(self, column: str) -> str:
        return column

    def time(self, param: str) -> str:
        return f":{param}"

    def raw(self, column: str) -> str:
        return f"CAST({column} AS BLOB)"


SQLITE = _SQLite()


def sqlite_job(row: Row) -> JobRecord:
    """A `JobRecord` from a row whose first columns are `JOB_SELECT`'s (the others are ignored)."""
    values = tuple(row)  # by position: a name lookup in a sqlite3.Row scans its columns
    columns: dict[str, Any] = dict(zip(_JOB_NAMES, values, strict=False))
    stored_id, id_type = columns["id"], values[len(_JOB_NAMES)]
    unreadable = _text_columns(columns, id_type=id_type)
    record = job_record(columns)
    if unreadable:
        stored = _stored_key(stored_id, id_type) if "id" in unreadable else None
        record = dataclasses.replace(record, unreadable={**unreadable, **record.unreadable}, key=stored)
    return record


def _text_columns(columns: dict[str, Any], *, id_type: str) -> dict[str, str]:
    """Decode the text columns in place (bytes that are not UTF-8 with U+FFFD); the ones that did not decode.

    An id that is not text at all (a BLOB inserted by another client) names no row ``WHERE id = ?`` can
    find, so it is unreadable even when its bytes decode.
    """
    unreadable: dict[str, str] = {}
    for name in _TEXT_COLUMNS:
        raw = columns[name]
        if raw is None:
            continue
        try:
            columns[name] = bytes(raw).decode()
        except UnicodeDecodeError:
            columns[name] = bytes(raw).decode(errors="replace")
            unreadable[name] = "not UTF-8 text"
    if id_type != "text" and "id" not in unreadable:
        unreadable["id"] = f"a {id_type}, not text"
    return unreadable


def _stored_key(raw: Any, id_type: str) -> str | bytes | None:
    """`JobRecord.key` of an id that did not read as text: its BLOB's bytes, or its text's bytes escaped."""
    if raw is None or id_type not in ("blob", "text"):
        return None
    return bytes(raw) if id_type == "blob" else bytes(raw).decode("utf-8", "surrogateescape")


def _appended(column: str, entry: str) -> str:
    """The JSON list ``column`` with the JSON ``entry`` appended (PostgreSQL: ``c || jsonb_build_array(e)``).

    A NULL list becomes ``[entry]``; a value that is JSON but not a list becomes the first element; text
    that is not JSON is kept in a marker entry (as `job_record` reads it), so nothing is lost.
    """
    return (
        f"CASE WHEN {column} IS NULL THEN json_array(json({entry}))"
        f" WHEN NOT json_valid({column}) THEN json_array(json_object('event', 'unreadable_history',"
        f" 'message', 'not JSON agentlife can read', 'raw', CAST({column} AS TEXT)), json({entry}))"
        f" WHEN json_type({column}) = 'array' THEN json_insert({column}, '$[#]', json({entry}))"
        f" ELSE json_array(json({column}), json({entry})) END"
    )


def _counted(key: str) -> str:
    """``tokens_consumed.key`` as a number: 0 when the column is not JSON or the field not a finite number."""
    value = f"json_extract(tokens_consumed, '$.{key}')"
    return (
        "CASE WHEN NOT json_valid(tokens_consumed) THEN 0"
        f" WHEN json_type(tokens_consumed, '$.{key}') IN ('integer', 'real')"
        f" AND abs({value}) <= 1.7976931348623157e308 THEN {value} ELSE 0 END"
    )


#: ``tokens_consumed`` plus the step's usage, as `add_usage_totals` adds it (whole tokens, cost to 6 places).
_USAGE = (
    f"json_object('input', CAST(({_counted('input')}) AS INTEGER) + :input_tokens,"
    f" 'output', CAST(({_counted('output')}) AS INTEGER) + :output_tokens,"
    f" 'cost_usd', round(({_counted('cost_usd')}) + :cost_usd, 6))"
)


#: The row carries a pause request (``paused.requested``); text that is not JSON carries none.
_PAUSE_REQUESTED = (
    "COALESCE(CASE WHEN json_valid(paused) THEN json_extract(paused, '$.requested') END = 1, 0)"
)


@functools.cache  # once per table layout in a process, not per store opened (~2 ms of parsing each)
def sqlite_statements(t: TableNames) -> Statements:
    """Every statement, for the tables ``t``."""
    j, sql = t.job, SQLITE.sql
    fenced = f"id = :job_id AND attempt = :attempt{SQLITE.fence}"

    def row(where: str, *extra: str) -> Sql:
        return sql(f"SELECT {', '.join((JOB_SELECT, *extra))} FROM {j} WHERE {where}")

    def updated(assignments: str) -> Chain:  # UPDATE ... RETURNING the row
        return Chain((sql(f"UPDATE {j} SET {assignments} WHERE id = :job_id"), row("id = :job_id")))

    def claim(agent: str, within: str = "") -> Chain:  # WITH next AS (... LIMIT 1) UPDATE ... RETURNING
        return Chain(
            (
                sql(
                    f"SELECT c.rowid AS key FROM {j} AS c WHERE {agent}{RUNNABLE_SQL} AND {_DUE}{within}"
                    " ORDER BY c.priority DESC, c.not_before, c.id LIMIT 1"
                ),
                sql(
                    f"UPDATE {j} SET status = 'RUNNING', attempt = attempt + 1, owner = :owner,"
                    " heartbeat_at = :now, updated_at = :now WHERE rowid = :key"
                ),
                row("rowid = :key", "rowid AS key", "NULL AS next_due"),
            )
        )

    own: dict[str, Statement] = {
        "get_job": row("id = :job_id"),
        "create_job": sql(
            f"INSERT OR IGNORE INTO {j}"
            " (id, agent_id, status, payload, attempt, token_budget, updated_at, not_before, concurrency_key,"
            " priority, incarnation)"
            " SELECT :job_id, :agent_id, :status, :payload, 0, :token_budget, :now, :now,"
            " :concurrency_key, :priority, :incarnation"
            f" WHERE NOT EXISTS (SELECT 1 FROM {t.pruned} WHERE id = :job_id)"
        ),
        "lock_claim": sql(
            f"SELECT attempt, owner, :now - heartbeat_at AS heartbeat_age FROM {j} WHERE id = :job_id"
        ),
        "take_claim": updated(
            f"attempt = :attempt, status = {CLAIMED_STATUS}, owner = :owner, heartbeat_at = :now,"
            " updated_at = :now"
        ),
        "claim_any": claim(""),
        "claim_agent": claim("agent_id = :agent_id AND "),
        # By rowid: a row whose id another client wrote as a BLOB, or as text that is not UTF-8, cannot be
        # found by its id, and must be set aside rather than stop every later claim.
        "set_aside": sql(
            f"UPDATE {j} SET status = '{SET_ASIDE_STATUS}', owner = NULL, error = :history, updated_at = :now"
            " WHERE rowid = :key AND attempt = :attempt AND owner = :owner AND status = 'RUNNING'"
        ),
        "release": sql(
            f"UPDATE {j} SET status = :status, owner = NULL, not_before = :now + :delay, updated_at = :now"
            " WHERE id = :job_id AND attempt = :attempt AND status = 'RUNNING'"
        ),
        "set_status": sql(
            f"UPDATE {j} SET status = :status, result = COALESCE(:result, result),"
            f" error = CASE WHEN :entry IS NULL THEN error ELSE {_appended('error', ':entry')} END,"
            f" updated_at = :now WHERE {fenced} AND {SQLITE.in_list('status', 'allowed', 'text')}"
        ),
        "lock_row": row(
            "id = :job_id", "owner", "approval", ":now - heartbeat_at AS heartbeat_age", "paused AS pause"
        ),
        "approve": updated("status = :status, not_before = :now, approval = :approval, updated_at = :now"),
        "reject": updated("status = 'FAILED', error = :history, approval = :approval, updated_at = :now"),
        "cancel": updated(
            "status = 'FAILED', error = :history, attempt = attempt + 1, owner = NULL, paused = NULL,"
            " updated_at = :now"
        ),
        # The attempt read under the lock: an operator who rewound, cancelled or claimed it first wins.
        "rewind_job": sql(
            f"UPDATE {j} SET checkpoint = :data, checkpoint_crc = :crc, checkpoint_id = :checkpoint_id,"
            " status = 'PENDING', attempt = attempt + 1, owner = NULL, not_before = :now, result = NULL,"
            " approval = NULL, waiting = NULL, paused = NULL, error = :history, updated_at = :now"
            " WHERE id = :job_id AND attempt = :attempt"
        ),
        # The owner stays: a reaped row's tombstone must go on fencing out the process it was taken from.
        "retry": updated(
            "status = 'PENDING', error = :history, not_before = :now, approval = :approval, paused = NULL,"
            " updated_at = :now"
        ),
        "pause": updated("status = :status, paused = :paused, error = :history, updated_at = :now"),
        "resume": updated(
            "status = :status, paused = NULL, error = :history, updated_at = :now,"
            " not_before = CASE WHEN :wake THEN :now ELSE not_before END"
        ),
        "settle_pause": sql(
            f"UPDATE {j} SET status = 'PAUSED', paused = json_set(json_remove(paused, '$.requested'),"
            " '$.from', status), updated_at = :now"
            f" WHERE id = :job_id AND {_PAUSE_REQUESTED} AND status IN ({SETTLES_PAUSE_SQL})"
        ),
        "pause_requested": sql(
            f"SELECT {_PAUSE_REQUESTED} FROM {j}"
            " WHERE id = :job_id AND attempt = :attempt AND status = 'RUNNING'"
        ),
        "clock": sql("SELECT :now"),
        # Ids as bytes, and only those stored as text: a row another client wrote with a BLOB id is set
        # aside by the next claim.
        "stale": sql(
            f"SELECT CAST(id AS BLOB) FROM {j} WHERE status = 'RUNNING' AND typeof(id) = 'text'"
            " AND COALESCE(heartbeat_at, updated_at) < :cutoff ORDER BY id"
        ),
        "owned_here": sql(
            f"SELECT CAST(id AS BLOB), CAST(owner AS BLOB) FROM {j} WHERE status = 'RUNNING'"
            " AND typeof(id) = 'text' AND owner LIKE :host AND COALESCE(heartbeat_at, updated_at) < :cutoff"
            " ORDER BY id"
        ),
        "lock_stale": row(
            "id = :job_id AND status = 'RUNNING' AND COALESCE(heartbeat_at, updated_at) < :cutoff"
        ),
        "lock_owned": row(
            "id = :job_id AND status = 'RUNNING' AND owner = :owner"
            " AND COALESCE(heartbeat_at, updated_at) < :cutoff"
        ),
        "reap": sql(
            f"UPDATE {j} SET status = :status, not_before = :not_before, owner = :owner, error = :history,"
            " updated_at = :at WHERE id = :job_id AND status = 'RUNNING' AND attempt = :attempt"
        ),
        "park": sql(
            f"UPDATE {j} SET status = 'WAITING', owner = NULL,"
            " not_before = CASE WHEN :at_once THEN :now ELSE :until END, waiting = :waiting,"
            " updated_at = :now"
            " WHERE id = :job_id AND attempt = :attempt AND status = 'RUNNING'"
        ),
        "insert_event": Chain(
            (
                sql(
                    f"INSERT INTO {t.event} (job_id, name, payload, sent_at)"
                    " VALUES (:job_id, :name, :payload, :now)"
                ),
                sql("SELECT last_insert_rowid()"),
            )
        ),
        "wake": sql(f"UPDATE {j} SET not_before = :now WHERE id = :job_id"),
        "take_event": Chain(
            (
                sql(
                    f"UPDATE {t.event} SET taken_by = :invocation_id WHERE seq = (SELECT seq FROM {t.event}"
                    " WHERE job_id = :job_id AND taken_by IS NULL AND sent_at <= :sent_by"
                    f" AND {SQLITE.in_list('name', 'names', 'text')} ORDER BY seq LIMIT 1)"
                ),
                sql(
                    f"SELECT name, payload FROM {t.event}"
                    " WHERE job_id = :job_id AND taken_by = :invocation_id"
                ),
            )
        ),
        "start_child": sql(
            f"INSERT OR IGNORE INTO {j} (id, agent_id, status, payload, attempt, updated_at, not_before,"
            " parent_id, spawned_by, detached, concurrency_key, priority, incarnation)"
            " SELECT :job_id, :agent_id, 'PENDING', :payload, 0, :now, :now, :parent_id, :invocation_id,"
            " :detached, :concurrency_key, :priority, :incarnation"
            f" WHERE EXISTS (SELECT 1 FROM {j} WHERE id = :parent_id AND attempt = :attempt{SQLITE.fence})"
            f" AND NOT EXISTS (SELECT 1 FROM {t.pruned} WHERE id = :job_id)"
        ),
        "append_records": Guarded(
            sql(f"SELECT 1 FROM {j} WHERE {fenced} AND {_LIVE}"), (_insert_records(t),)
        ),
        "record_delivery": sql(
            f"INSERT OR IGNORE INTO {t.delivery} (key, job_id, channel, delivered_at)"
            " VALUES (:key, :job_id, :channel, :now)"
        ),
    }
    page = functools.partial(_page, t)
    checkpoint = functools.cache(functools.partial(_checkpoint, t))

    @functools.cache
    def claim_limited(agent: bool, keys: bool, agents: bool) -> Statement:
        mine = "agent_id = :agent_id AND " if agent else ""
        return claim(mine, _within_limits(t, agent=agent, keys=keys, agents=agents))

    output = sqlite_output_statements(t, SQLITE.fence)
    return Statements(
        **shared_statements(t, SQLITE),
        **own,
        **output,
        **prune_statements(t, SQLITE, skip_locked=False, delta=True),
        page=page,
        checkpoint=checkpoint,
        claim_limited=claim_limited,
        keys=True,
    )


def _within_limits(t: TableNames, *, agent: bool, keys: bool, agents: bool) -> str:
    """The limited claim's test of a candidate ``c``: its key, and its agent, below their running limits.

    ``:key_limits`` is a JSON object of per-key limits, ``:key_default`` the limit of other keys and
    ``:agent_limit`` the agent's (NULL: none). The claim runs in a ``BEGIN IMMEDIATE`` transaction, so no
    other claim can change the counts between this test and the update.
    """
    j = t.job
    # json(:key_limits): the parameter is JSON text already, not a list for `json_each(:name)` to encode.
    limit = (
        "COALESCE((SELECT o.value FROM json_each(json(:key_limits)) AS o WHERE o.key = r.concurrency_key),"
        " :key_default)"
    )
    whose = ":agent_id" if agent else "c.agent_id"  # one count for an agent's claim, not one per row
    key_test = (
        " AND (c.concurrency_key IS NULL OR c.concurrency_key NOT IN (SELECT r.concurrency_key FROM"
        f" {j} AS r WHERE r.status = 'RUNNING' AND r.concurrency_key IS NOT NULL GROUP BY r.concurrency_key"
        f" HAVING count(*) >= {limit}))"
    )
    agent_test = (
        f" AND (SELECT count(*) FROM {j} AS a WHERE a.status = 'RUNNING' AND a.agent_id = {whose})"
        " < :agent_limit"
    )
    return (key_test if keys else "") + (agent_test if agents else "")


def _insert_records(t: TableNames) -> Many:
    return Many(
        Sql.named(
            f"INSERT OR IGNORE INTO {t.step_record} (job_id, step, attempt, session, seq, data)"
            " VALUES (:job_id, :record_steps, :attempt, :session, :record_seqs, :record_data)"
        ),
        ("record_steps", "record_seqs", "record_data"),
    )


def _checkpoint(t: TableNames, shape: tuple[bool, bool, bool, bool, bool]) -> Statement:
    """The checkpoint write: the fenced row update, then the rest only if it matched (one transaction).

    Every SQLite commit is flushed: the file has no log that a later commit would flush first.
    """
    messages, records, prune, usage, _ = shape
    j, h, sql = t.job, t.checkpoint_history, SQLITE.sql
    then: list[Sql | Many] = []
    if usage:
        then.append(sql(f"UPDATE {j} SET tokens_consumed = {_USAGE} WHERE id = :job_id"))
    then += [
        sql(
            f"INSERT OR REPLACE INTO {h} (job_id, checkpoint_id, step, checkpoint, crc, created_at)"
            " VALUES (:job_id, :checkpoint_id, :step, :data, :crc, :now)"
        ),
        sql(
            f"DELETE FROM {h} WHERE job_id = :job_id AND checkpoint_id NOT IN (SELECT checkpoint_id FROM {h}"
            f" WHERE job_id = :job_id ORDER BY created_at DESC, step DESC LIMIT {HISTORY_KEEP})"
        ),
    ]
    if messages:
        insert = (
            f"INSERT OR REPLACE INTO {t.conversation} (job_id, seq, step, message)"
            " VALUES (:job_id, :seqs, :step, :messages)"
        )
        then.append(Many(sql(insert), ("seqs", "messages")))
    if records:
        then.append(_insert_records(t))
    if prune:
        then.append(sql(f"DELETE FROM {t.step_record} WHERE job_id = :job_id AND step < :kept_from"))
    fenced = sql(
        f"UPDATE {j} SET checkpoint = :data, checkpoint_crc = :crc, checkpoint_id = :checkpoint_id,"
        f" updated_at = :now, heartbeat_at = :now WHERE id = :job_id AND attempt = :attempt{SQLITE.fence}"
        f" AND {_LIVE}"
    )
    return Guarded(fenced, tuple(then))


def _page(
    t: TableNames, status: bool, agent: bool, after: tuple[Any, str | bytes | None] | None, key: bool = False
) -> tuple[Statement, dict[str, Any]]:
    """A `list_jobs` page's statement, and its cursor's parameters."""
    if after is None:
        return _page_sql(t, status, agent, None, key), {}
    test, cursor = _after_key(after[1])
    return _page_sql(t, status, agent, test, key), {"after_at": after[0], **cursor}


def _after_key(key: str | bytes | None) -> tuple[str, dict[str, Any]]:
    """The test "id follows ``key``" in SQLite's order of ids (NULL, text by its bytes, then BLOBs)."""
    if key is None:  # a NULL id (SQLite's PRIMARY KEY allows one) comes before every other
        return "id IS NOT NULL", {}
    if isinstance(key, bytes):  # a BLOB: after every text id, then by its bytes
        return "id > :after_key", {"after_key": key}
    try:
        key.encode()
    except UnicodeEncodeError:  # text that is not UTF-8 (`JobRecord.key`): the same bytes, as text
        return "id > CAST(:after_key AS TEXT)", {"after_key": key.encode("utf-8", "surrogateescape")}
    return "id > :after_key", {"after_key": key}


@functools.cache
def _page_sql(t: TableNames, status: bool, agent: bool, after: str | None, key: bool = False) -> Sql:
    filters = (("status = :status", status), ("agent_id = :agent_id", agent), ("concurrency_key = :key", key))
    clauses = [c for c, on in filters if on]
    if after is not None:
        # The first term bounds the index range; the second skips the cursor's own ties. The key is compared
        # as stored: an id that is a BLOB or text that is not UTF-8 must not come back first on the next page.
        clauses.append(f"updated_at <= :after_at AND (updated_at < :after_at OR {after})")
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    return Sql.named(f"SELECT {JOB_SELECT} FROM {t.job}{where} ORDER BY updated_at DESC, id LIMIT :limit")
