"""PostgreSQL's statements for the store's operations, and how it reads a job row.

Where SQLite runs several statements in a transaction, PostgreSQL writes one: an ``UPDATE ... RETURNING``,
a data-modifying CTE (the checkpoint write: the row, the history, the conversation and the step records in
one round trip), a claim that picks and takes the oldest runnable row ``FOR UPDATE SKIP LOCKED``. A write
that makes a job runnable now calls ``pg_notify`` in the same statement, so an idle worker listening
(`_pg_listen`) hears of it when, and only if, the write commits. Times are the server's (``now()``); a
list parameter is an array (``= ANY(:ids::text[])``).

Without an ``owner`` column (a job table made before the claim token, until ``db init`` adds it) the writes
of a job's process are fenced by the attempt alone.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Any

from agentlife.stores._base import HISTORY_KEEP, JobRecord, TableNames
from agentlife.stores._dialect import (
    RUNNABLE_LIST,
    RUNNABLE_SQL,
    SETTLES_PAUSE_SQL,
    TERMINAL_SQL,
    Row,
    Sql,
    Statement,
    Statements,
    shared_statements,
)
from agentlife.stores._output_sql import pg_output_statements
from agentlife.stores._prune import prune_statements
from agentlife.stores._rows import JSON_COLUMNS, SET_ASIDE_STATUS, job_record

__all__ = [
    "HEARTBEAT_AGE",
    "NOTIFY_PAYLOAD_LIMIT",
    "channel_prefix",
    "end_channel_prefix",
    "notify_call",
    "pg_job",
    "pg_statements",
    "unix",
]

#: The job row's columns as `pg_job` reads them, before those of concurrency keys (`KEY_COLUMNS`) and
#: ``not_before``, which a statement selects where the table has them.
JOB_COLUMNS = (
    "id, agent_id, status, payload, attempt, checkpoint_id, checkpoint_crc, heartbeat_at, tokens_consumed,"
    " token_budget, error, result, updated_at"
)
#: The columns of concurrency keys, where the table has them (`pg_statements` ``keys``).
KEY_COLUMNS = ", concurrency_key, priority, incarnation"
_DUE = "(not_before IS NULL OR not_before <= now())"
#: Seconds since the row's ``heartbeat_at``, each side taken as epoch seconds first: PostgreSQL keeps
#: ``'infinity'`` and ``'-infinity'`` as timestamps (a row written by another client) and refuses to
#: subtract them, while their epochs are floats (a heartbeat for ever fresh, or for ever stale).
HEARTBEAT_AGE = "(EXTRACT(EPOCH FROM now()) - EXTRACT(EPOCH FROM heartbeat_at))::float8"
#: Seconds from now to the earliest ``not_before`` of the rows selected, the same way (a row parked until
#: ``'infinity'`` by another client is a timer that never comes due).
SECONDS_TO_NEXT_DUE = "(EXTRACT(EPOCH FROM min(not_before)) - EXTRACT(EPOCH FROM now()))::float8"
#: What a claim makes of the row's status: a runnable row (a parked wait's too) is RUNNING, others stay.
_CLAIMED_STATUS = "CASE WHEN status IN ('PENDING', 'RETRYING', 'WAITING') THEN 'RUNNING' ELSE status END"
#: Appends the JSON parameter ``:entry`` to the crash history, in jsonb: a history agentlife cannot read is
#: kept as it is (a non-array becomes the first element).
_APPEND = "error = COALESCE(error, '[]'::jsonb) || jsonb_build_array(:entry::jsonb)"
_LIVE = f"status NOT IN ({TERMINAL_SQL})"
#: The order of a worker's claim: higher priority first, then the row due first (a new job is due when it
#: is created, so jobs of one priority start in creation order, whatever their key), then the id.
CLAIM_ORDER = "priority DESC, not_before NULLS FIRST, id"
#: Whether the agent has a due runnable row, each half one probe of its (agent, not_before) index. The claim
#: orders by priority first, so without it a claim that finds nothing due reads every runnable row of the
#: agent not yet due (a parked wait's): its cost grew with the waiting rows. Evaluated once per statement.
#: The second half is a min(), not an EXISTS: the planner, which takes status and not_before for independent,
#: expects an agent with finished rows in the past to have many due rows, and read an EXISTS by a sequential
#: scan of the whole table; a min() is always read from the index's first entry.
_AGENT_HAS_DUE = (
    f" AND (EXISTS (SELECT 1 FROM {{j}} WHERE agent_id = :agent_id AND {RUNNABLE_SQL} AND not_before IS NULL)"
    f" OR (SELECT min(not_before) FROM {{j}} WHERE agent_id = :agent_id AND {RUNNABLE_SQL}) <= now())"
)
#: A row made RUNNING by anything but a worker's limited claim holds no slot of its key or agent: a slot
#: kept from an earlier claim could meet the same slot a limited claim gave another row meanwhile.
_NO_SLOTS = "key_slot = NULL, agent_slot = NULL"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _Postgres:
    """PostgreSQL's spelling of what SQL databases write differently (a `Dialect`)."""

    now = "now()"
    for_update = " FOR UPDATE"

    def __init__(self, owner: bool) -> None:
        self.fence = " AND (owner IS NULL OR owner = :owner)" if owner else ""

    def sql(self, text: str) -> Sql:
        return Sql.numbered(text)

    def in_list(self, column: str, param: str, sql_type: str) -> str:
        return f"{column} = ANY(:{param}::{sql_type}[])"

    def json(self, param: str) -> str:
        return f":{param}::jsonb"

    def epoch(self, column: str) -> str:
        return f"EXTRACT(EPOCH FROM {column})::float8"

    def time(self, param: str) -> str:
        return f"to_timestamp(:{param})"

    def raw(self, column: str) -> str:
        return column


@functools.cache  # once per table layout in a process, not per store opened (~2 ms of parsing each)
def pg_statements(t: TableNames, *, owner: bool = True, keys: bool = True) -> Statements:
    """Every statement, for the tables ``t``; without ``owner`` (no such column) fenced by attempt alone.

    Without ``keys`` (a table from before concurrency keys, until ``db init`` adds them) the job's process
    reads and writes its row as before; what needs the keys asks for ``db init``.
    """
    d = _Postgres(owner)
    job_cols = f"{JOB_COLUMNS}{KEY_COLUMNS if keys else ''}"
    cols = f"{job_cols}, not_before"
    no_slots = f", {_NO_SLOTS}" if keys else ""
    key_columns, key_values = (
        (KEY_COLUMNS, ", :concurrency_key::text, :priority::integer, :incarnation::text")
        if keys
        else ("", "")
    )
    j, sql, notify = t.job, d.sql, notify_call(t)
    fenced = f"id = :job_id AND attempt = :attempt{d.fence}"
    no_pause = ", paused = NULL" if keys else ""

    def claim(agent: str, *extra: str, guard: str = "") -> str:
        return (
            f"WITH next AS (SELECT id AS next_id FROM {j} WHERE {agent}{RUNNABLE_SQL} AND {_DUE}{guard}"
            f" ORDER BY {CLAIM_ORDER} LIMIT 1 FOR UPDATE SKIP LOCKED)"
            f" UPDATE {j} SET status = 'RUNNING', attempt = attempt + 1, owner = :owner,"
            f" heartbeat_at = now(), updated_at = now(){no_slots}"
            f" FROM next WHERE id = next.next_id RETURNING {', '.join((cols, 'id AS key', *extra))}"
        )

    # One row always: the claimed job's columns, or NULLs and the seconds until the agent's next row not yet
    # due (a timer's end) comes due, which the idle wait after a fruitless claim needs: one round trip where
    # there were two. The due time is looked up only when nothing was claimed (an uncorrelated NOT EXISTS).
    next_due_when_idle = (
        f"SELECT {SECONDS_TO_NEXT_DUE} FROM {j}"
        f" WHERE agent_id = :agent_id AND {RUNNABLE_SQL} AND not_before > now()"
        " AND NOT EXISTS (SELECT 1 FROM claimed)"
    )
    lock_when = "COALESCE(heartbeat_at, updated_at) < to_timestamp(:cutoff) FOR UPDATE SKIP LOCKED"
    text: dict[str, str] = {
        "get_job": f"SELECT {job_cols} FROM {j} WHERE id = :job_id",
        # Wakes the agent's idle workers on commit; an existing row (no insert) wakes nobody.
        "create_job": (
            # Not an id whose job was pruned: a create retried after the prune must not run it again.
            f"WITH created AS (INSERT INTO {j}"
            f" (id, agent_id, status, payload, attempt, token_budget, updated_at{key_columns})"
            " SELECT :job_id::text, :agent_id::text, :status::text, :payload::jsonb, 0, :token_budget::jsonb,"
            f" now(){key_values} WHERE NOT EXISTS (SELECT 1 FROM {t.pruned} WHERE id = :job_id::text)"
            f" ON CONFLICT (id) DO NOTHING RETURNING agent_id) SELECT {notify} FROM created"
        ),
        "lock_claim": (
            f"SELECT attempt, {'owner' if owner else 'NULL AS owner'}, {HEARTBEAT_AGE} AS heartbeat_age"
            f" FROM {j} WHERE id = :job_id FOR UPDATE"
        ),
        "take_claim": (
            f"UPDATE {j} SET attempt = :attempt{', owner = :owner' if owner else ''}, heartbeat_at = now(),"
            f" updated_at = now(), status = {_CLAIMED_STATUS}{no_slots}"
            f" WHERE id = :job_id RETURNING {job_cols}"
        ),
        "claim_any": claim("", "NULL::float8 AS next_due"),
        "claim_agent": (
            f"WITH claimed AS ({claim('agent_id = :agent_id AND ', guard=_AGENT_HAS_DUE.format(j=j))})"
            f" SELECT claimed.*, ({next_due_when_idle}) AS next_due FROM (SELECT 1) AS one"
            " LEFT JOIN claimed ON true"
        ),
        "set_aside": (
            f"UPDATE {j} SET status = '{SET_ASIDE_STATUS}', owner = NULL, updated_at = now(), {_APPEND}"
            " WHERE id = :key AND attempt = :attempt AND owner = :owner AND status = 'RUNNING'"
        ),
        "release": (
            f"UPDATE {j} SET status = :status, owner = NULL,"
            " not_before = now() + make_interval(secs => :delay), updated_at = now()"
            " WHERE id = :job_id AND attempt = :attempt AND status = 'RUNNING' RETURNING 1,"
            f" CASE WHEN :delay::float8 <= 0 THEN {notify} END"
        ),
        # :allowed: the statuses the write expects to find (never a terminal one unless asked).
        "set_status": (
            f"UPDATE {j} SET status = :status, result = COALESCE(:result::jsonb, result),"
            " error = CASE WHEN :entry::jsonb IS NULL THEN error"
            " ELSE COALESCE(error, '[]'::jsonb) || jsonb_build_array(:entry::jsonb) END,"
            f" updated_at = now(){no_slots} WHERE {fenced} AND status = ANY(:allowed::text[])"
        ),
        "lock_row": f"SELECT {cols}, owner, approval, {HEARTBEAT_AGE} AS heartbeat_age,"
        f" {'paused' if keys else 'NULL::jsonb'} AS pause FROM {j} WHERE id = :job_id FOR UPDATE",
        "approve": (
            f"UPDATE {j} SET status = :status, approval = :approval::jsonb, not_before = now(),"
            f" updated_at = now(){no_slots} WHERE id = :job_id"
            f" RETURNING {cols}, CASE WHEN :status = 'PENDING' THEN {notify} END AS notified"
        ),
        "reject": (
            f"UPDATE {j} SET status = 'FAILED', {_APPEND}, approval = :approval::jsonb, updated_at = now()"
            f" WHERE id = :job_id RETURNING {cols}"
        ),
        "cancel": (
            f"UPDATE {j} SET status = 'FAILED', {_APPEND}, attempt = attempt + 1, owner = NULL{no_pause},"
            f" updated_at = now() WHERE id = :job_id RETURNING {cols}"
        ),
        # The attempt read under the lock: an operator who rewound, cancelled or claimed it first wins.
        "rewind_job": (
            f"UPDATE {j} SET checkpoint = :data, checkpoint_crc = :crc, checkpoint_id = :checkpoint_id,"
            f" status = 'PENDING', attempt = attempt + 1{', owner = NULL' if owner else ''},"
            " not_before = now(), result = NULL, approval = NULL, waiting = NULL, error = :history::jsonb,"
            f" updated_at = now(){no_slots}{no_pause} WHERE id = :job_id AND attempt = :attempt"
            f" RETURNING {notify}"
        ),
        # The owner stays: a reaped row's tombstone must go on fencing out the process it was taken from.
        "retry": (
            f"UPDATE {j} SET status = 'PENDING', {_APPEND}, approval = :approval::jsonb, not_before = now(),"
            f" updated_at = now(){no_pause} WHERE id = :job_id RETURNING {cols}, {notify} AS notified"
        ),
        **_pause_statements(j, cols, notify, keys),
        "clock": "SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8",
        "stale": (
            f"SELECT id FROM {j} WHERE status = 'RUNNING'"
            " AND COALESCE(heartbeat_at, updated_at) < to_timestamp(:cutoff) ORDER BY id"
        ),
        "owned_here": (
            f"SELECT id, owner FROM {j} WHERE status = 'RUNNING' AND owner LIKE :host"
            " AND COALESCE(heartbeat_at, updated_at) < to_timestamp(:cutoff) ORDER BY id"
        ),
        "lock_stale": f"SELECT {cols} FROM {j} WHERE id = :job_id AND status = 'RUNNING' AND {lock_when}",
        "lock_owned": (
            f"SELECT {cols} FROM {j} WHERE id = :job_id AND status = 'RUNNING' AND owner = :owner"
            f" AND {lock_when}"
        ),
        "reap": (
            f"UPDATE {j} SET status = :status, owner = :owner, not_before = to_timestamp(:not_before),"
            f" updated_at = to_timestamp(:at), {_APPEND}"
            " WHERE id = :job_id AND status = 'RUNNING' AND attempt = :attempt RETURNING 1,"
            # A row whose backoff has not ended is not runnable yet: the fallback poll finds it later.
            f" CASE WHEN :status IN ('PENDING', 'RETRYING') AND {_DUE} THEN {notify} END"
        ),
        # A wait already over (or woken while the job parked: time 0) wakes a listening worker at once.
        "park": (
            f"UPDATE {j} SET status = 'WAITING', owner = NULL, not_before = to_timestamp({_WAIT_ENDS}),"
            " waiting = :waiting::jsonb, updated_at = now()"
            " WHERE id = :job_id AND attempt = :attempt AND status = 'RUNNING'"
            f" RETURNING 1, CASE WHEN to_timestamp({_WAIT_ENDS}) <= now() THEN {notify} END"
        ),
        "insert_event": (
            f"INSERT INTO {t.event} (job_id, name, payload) VALUES (:job_id, :name, :payload::jsonb)"
            " RETURNING seq"
        ),
        "wake": f"UPDATE {j} SET not_before = now() WHERE id = :job_id RETURNING {notify}",
        "take_event": (
            f"UPDATE {t.event} SET taken_by = :invocation_id WHERE seq = (SELECT seq FROM {t.event}"
            " WHERE job_id = :job_id AND taken_by IS NULL AND name = ANY(:names::text[])"
            " AND EXTRACT(EPOCH FROM sent_at) <= :sent_by::float8 ORDER BY seq LIMIT 1)"
            " RETURNING name, payload"
        ),
        # Fenced by the parent's attempt and claim token, a no-op on an existing id, and a wake-up for the
        # child agent's idle workers when it inserted.
        "start_child": (
            f"WITH created AS (INSERT INTO {j} (id, agent_id, status, payload, attempt, updated_at,"
            f" parent_id, spawned_by, detached{key_columns})"
            " SELECT :job_id, :agent_id, 'PENDING', :payload::jsonb, 0, now(), :parent_id, :invocation_id,"
            f" :detached{key_values}"
            f" WHERE EXISTS (SELECT 1 FROM {j} WHERE id = :parent_id AND attempt = :attempt"
            " AND (owner IS NULL OR owner = :owner))"
            f" AND NOT EXISTS (SELECT 1 FROM {t.pruned} WHERE id = :job_id)"
            f" ON CONFLICT (id) DO NOTHING RETURNING agent_id) SELECT {notify} FROM created"
        ),
        # FOR SHARE: a claim of the row waits for this insert to commit, so the attempt that takes the job
        # over reads this record; a claim that committed first makes the row fail the fence here.
        "append_records": (
            f"WITH held AS (SELECT 1 FROM {j} WHERE {fenced} AND {_LIVE} FOR SHARE),"
            f" stored AS ({_insert_records(t, 'held')}) SELECT 1 FROM held"
        ),
        "record_delivery": (
            f"INSERT INTO {t.delivery} (key, job_id, channel, delivered_at) VALUES (:key, :job_id, :channel,"
            " now()) ON CONFLICT (key) DO NOTHING"
        ),
    }
    built = {name: sql(statement) for name, statement in text.items()}
    page = functools.partial(_page, t, cols)
    claim_limited = functools.cache(functools.partial(_claim_limited, t, cols, next_due_when_idle))
    checkpoint = functools.cache(functools.partial(_checkpoint, t, d.fence))
    output = pg_output_statements(t, d.fence)
    return Statements(
        **shared_statements(t, d),
        **built,
        **output,
        **prune_statements(t, d, skip_locked=True, delta=False),
        page=page,
        checkpoint=checkpoint,
        claim_limited=claim_limited,
        keys=keys,
    )


def limited_claim(t: TableNames, columns: str, *, any_agent: bool, keys: bool, agents: bool) -> str:
    """The claim that skips rows whose concurrency key, or agent, has as many RUNNING rows as its limit.

    Parameters beside the plain claim's: with ``keys``, ``:key_limits`` (a JSON object of per-key limits)
    and ``:key_default`` (the limit of other keys, NULL for none); with ``agents``, ``:agent_limit``. A
    limit not set leaves its test out of the text, not to a NULL parameter: so PostgreSQL's generic plan
    costs what a custom one does and a prepared claim is planned once, not at each call (~3 ms). One
    statement: the keys at their limit are counted once (``full_keys``), the first row in the claim's order
    whose key is not among them, and that is its limited key's first runnable row (so a key's rows start in
    order even while a concurrent claim holds its first one locked), is locked ``SKIP LOCKED`` as by the
    plain claim, and the update gives it the lowest free slot of its key (1 to the limit) and of its agent.
    Two claims whose snapshots overlap can both count a key below its limit; they then pick the same free
    slot, and the unique index on the RUNNING rows' slots makes the later one fail (`_claims.claim_next`
    claims again, seeing the first): a limit never holds more RUNNING rows than it allows, whatever the
    interleaving.
    """
    j = t.job

    def limit(key: str) -> str:
        return f"COALESCE((:key_limits::jsonb ->> {key})::integer, :key_default::integer)"

    def free_slot(column: str, value: str, slot: str) -> str:
        # The lowest free slot: 1, else one past the lowest held slot whose successor is free.
        held = f"FROM {j} AS r WHERE r.status = 'RUNNING' AND r.{column} = {value}"
        return (
            f"CASE WHEN NOT EXISTS (SELECT 1 {held} AND r.{slot} = 1) THEN 1 ELSE (SELECT min(r.{slot}) + 1"
            f" {held} AND r.{slot} IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {j} AS f"
            f" WHERE f.status = 'RUNNING' AND f.{column} = {value} AND f.{slot} = r.{slot} + 1)) END"
        )

    agent_running = (
        f"(SELECT count(*) FROM {j} AS a WHERE a.status = 'RUNNING'"
        f" AND a.agent_id = {'c.agent_id' if any_agent else ':agent_id'})"
    )
    agent = "" if any_agent else "c.agent_id = :agent_id AND "
    has_due = "" if any_agent else _AGENT_HAS_DUE.format(j=j)
    full_keys = (
        f"full_keys AS (SELECT concurrency_key AS full_key FROM {j}"
        " WHERE status = 'RUNNING' AND concurrency_key IS NOT NULL"
        f" GROUP BY concurrency_key HAVING count(*) >= {limit('concurrency_key')}), "
    )
    key_tests = (
        " AND (c.concurrency_key IS NULL OR c.concurrency_key NOT IN (SELECT full_key FROM full_keys))"
        # Only the first runnable row of a limited key: while a concurrent claim holds it locked, the key is
        # skipped, not served out of order from its younger rows.
        f" AND (c.concurrency_key IS NULL OR {limit('c.concurrency_key')} IS NULL OR c.id = (SELECT o.id"
        f" FROM {j} AS o WHERE o.concurrency_key = c.concurrency_key AND {RUNNABLE_SQL} AND {_DUE}"
        f" ORDER BY {', '.join('o.' + part for part in CLAIM_ORDER.split(', '))} LIMIT 1))"
    )
    key_slot = (
        f"CASE WHEN next_key IS NULL OR {limit('next_key')} IS NULL THEN NULL"
        f" ELSE {free_slot('concurrency_key', 'next_key', 'key_slot')} END"
    )
    agent_test = f" AND {agent_running} < :agent_limit::integer"
    return (
        f"WITH {full_keys if keys else ''}"
        f"next AS (SELECT c.id AS next_id, c.concurrency_key AS next_key, c.agent_id AS next_agent"
        f" FROM {j} AS c WHERE {agent}{RUNNABLE_SQL} AND {_DUE}{has_due}"
        f"{key_tests if keys else ''}{agent_test if agents else ''}"
        f" ORDER BY {', '.join('c.' + part for part in CLAIM_ORDER.split(', '))}"
        " LIMIT 1 FOR UPDATE OF c SKIP LOCKED)"
        f" UPDATE {j} SET status = 'RUNNING', attempt = attempt + 1, owner = :owner,"
        " heartbeat_at = now(), updated_at = now(),"
        f" key_slot = {key_slot if keys else 'NULL'},"
        f" agent_slot = {free_slot('agent_id', 'next_agent', 'agent_slot') if agents else 'NULL'}"
        f" FROM next WHERE id = next.next_id RETURNING {columns}, id AS key"
    )


def _claim_limited(
    t: TableNames, columns: str, next_due_when_idle: str, agent: bool, keys: bool, agents: bool
) -> Statement:
    """The limited claim of one agent's jobs (``agent``) or any agent's, with the limits set."""
    statement = limited_claim(t, columns, any_agent=not agent, keys=keys, agents=agents)
    if not agent:
        return Sql.numbered(statement + ", NULL::float8 AS next_due")
    return Sql.numbered(
        f"WITH claimed AS ({statement}) SELECT claimed.*, ({next_due_when_idle}) AS next_due"
        " FROM (SELECT 1) AS one LEFT JOIN claimed ON true"
    )


#: When a parked wait ends: now for one woken while the job parked (time 0, as a timestamp), else its end.
_WAIT_ENDS = "CASE WHEN :at_once::boolean THEN 0 ELSE :until::float8 END"


def _checkpoint(t: TableNames, fence: str, shape: tuple[bool, bool, bool, bool, bool]) -> Statement:
    messages, records, prune, _, flushed = shape  # the usage is added by a CASE: no shape of its own
    return Sql.numbered(
        write_checkpoint_sql(
            t, fence=fence, conversation=messages, records=records, prune=prune, flushed=flushed
        )
    )


def write_checkpoint_sql(
    t: TableNames,
    *,
    fence: str,
    conversation: bool = True,
    records: bool = False,
    prune: bool = False,
    flushed: bool = True,
) -> str:
    """The fenced checkpoint write: the step's whole durable record in one statement, one round trip.

    Parameters: ``:job_id``, ``:attempt``, ``:data``, ``:crc``, ``:checkpoint_id``, ``:step``, the step's
    ``:input_tokens``, ``:output_tokens`` and ``:cost_usd`` (added to ``tokens_consumed``), the claim token
    ``:owner`` (with a fence), then only those asked for: the conversation's new rows (``:seqs``,
    ``:messages``), step records of this session (``:session``, ``:record_steps``, ``:record_seqs``,
    ``:record_data``), the first step whose records are kept (``:kept_from``). A step that adds no
    conversation rows and no records sends no array: the arrays' types are not built in to asyncpg, so each
    connection's first statement that sends them costs a catalog query (about 3 ms of server time), which a
    worker's freshly opened connections would otherwise pay for every step.
    The job row (checkpoint, usage, ``heartbeat_at``), the history entry, the history trim and
    the conversation rows commit together or not at all: a statement is atomic without a transaction
    block, which would cost a round trip for ``BEGIN`` and one for ``COMMIT``. It returns one row when the
    fenced update matched, none otherwise.

    All CTEs see the same snapshot, so the trim cannot see the entry being inserted: it keeps the newest
    ``HISTORY_KEEP - 1`` *other* entries, which with the new one makes ``HISTORY_KEEP``. It deletes what is
    older than the oldest entry to keep (a row comparison against one index-ordered probe: about half the
    cost of ``NOT IN (... LIMIT n)``). Nothing else happens when the fenced UPDATE matched no row.
    ``tokens_consumed`` fields that are not numbers (a row written by hand) count from 0.

    Without ``flushed`` the commit does not wait for the WAL flush (``synchronous_commit`` off for this
    transaction alone): the row is committed and seen by every session at once, a crash of the agent's
    process loses nothing, and the WAL is written in order, so the next commit that waits (any session's:
    a write-ahead record before an effect, a claim, a status change) makes this one durable first. Only a
    crash of the PostgreSQL server before that can lose it, and then the job resumes from the checkpoint
    before it, replaying the step from its stored write-ahead records.
    """
    h = t.checkpoint_history
    if HISTORY_KEEP > 1:
        older_than_kept = f"""AND (created_at, step) < (
                SELECT created_at, step FROM {h} WHERE job_id = :job_id AND checkpoint_id <> :checkpoint_id
                ORDER BY created_at DESC, step DESC OFFSET {HISTORY_KEEP - 2} LIMIT 1)"""
    else:
        older_than_kept = ""
    extra: list[str] = []
    # Evaluated only when the fenced update matched; local to the statement's own transaction.
    relaxed = "" if flushed else " WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL"
    if conversation:
        extra.append(
            f"""saved AS (
            INSERT INTO {t.conversation} (job_id, seq, step, message)
            SELECT :job_id, rows.seq, :step, rows.message
            FROM unnest(:seqs::integer[], :messages::bytea[]) AS rows(seq, message)
            WHERE EXISTS (SELECT 1 FROM fenced)
            ON CONFLICT (job_id, seq) DO UPDATE SET step = EXCLUDED.step, message = EXCLUDED.message
            RETURNING 1
        )"""
        )
    if records:
        extra.append(f"recorded AS ({_insert_records(t, 'fenced')})")
    if prune:
        extra.append(
            f"""pruned AS (
            DELETE FROM {t.step_record}
            WHERE job_id = :job_id AND step < :kept_from::integer AND EXISTS (SELECT 1 FROM fenced)
            RETURNING 1
        )"""
        )
    return f"""
        WITH fenced AS (
            UPDATE {t.job} SET checkpoint = :data, checkpoint_crc = :crc, checkpoint_id = :checkpoint_id,
                updated_at = now(), heartbeat_at = now(),
                tokens_consumed = CASE WHEN :input_tokens::bigint = 0 AND :output_tokens::bigint = 0
                    AND :cost_usd::float8 = 0 THEN tokens_consumed ELSE jsonb_build_object(
                        'input', {_counted("input")} + :input_tokens::bigint,
                        'output', {_counted("output")} + :output_tokens::bigint,
                        'cost_usd', round({_counted("cost_usd")} + :cost_usd::float8::numeric, 6)) END
            WHERE id = :job_id AND attempt = :attempt AND {_LIVE}{fence}
            RETURNING id
        ), appended AS (
            INSERT INTO {h} (job_id, checkpoint_id, step, checkpoint, crc, created_at)
            SELECT id, :checkpoint_id, :step, :data, :crc, clock_timestamp() FROM fenced
            ON CONFLICT (job_id, checkpoint_id) DO UPDATE
                SET step = EXCLUDED.step, checkpoint = EXCLUDED.checkpoint, crc = EXCLUDED.crc,
                    created_at = EXCLUDED.created_at
            RETURNING job_id
        ), trimmed AS (
            DELETE FROM {h}
            WHERE job_id = :job_id AND checkpoint_id <> :checkpoint_id AND EXISTS (SELECT 1 FROM fenced)
              {older_than_kept}
            RETURNING 1
        ){"".join(", " + part for part in extra)}
        SELECT 1 FROM fenced{relaxed}
    """


def _insert_records(t: TableNames, guard: str) -> str:
    """Insert one session's step records (arrays of steps, seqs, lines) if the CTE ``guard`` found a row."""
    return (
        f"INSERT INTO {t.step_record} (job_id, step, attempt, session, seq, data)"
        " SELECT :job_id, r.step, :attempt, :session, r.seq, r.data"
        " FROM unnest(:record_steps::integer[], :record_seqs::integer[], :record_data::bytea[])"
        f" AS r(step, seq, data) WHERE EXISTS (SELECT 1 FROM {guard}) ON CONFLICT DO NOTHING RETURNING 1"
    )


def _counted(key: str) -> str:
    """``tokens_consumed.key`` as a number, 0 when it is missing or not a number."""
    return (
        f"(CASE WHEN jsonb_typeof(tokens_consumed -> '{key}') = 'number'"
        f" THEN (tokens_consumed ->> '{key}')::numeric ELSE 0 END)"
    )


# -- reading rows --------------------------------------------------------------------------------------------


def pg_job(row: Row) -> JobRecord:
    """A `JobRecord` from an asyncpg row (``not_before`` when the query selected it).

    A JSON column the row holds but agentlife cannot read (jsonb keeps ``1e400``, no float does) is named in
    ``JobRecord.unreadable`` rather than raised: see `agentlife.stores._rows`.
    """
    columns = {name: row[name] for name in ("id", "agent_id", "status", "attempt", *JSON_COLUMNS)}
    columns.update(
        checkpoint_id=row["checkpoint_id"],
        checkpoint_crc=row["checkpoint_crc"],
        heartbeat_at=unix(row["heartbeat_at"]),
        updated_at=unix(row["updated_at"]),
        not_before=unix(row.get("not_before")),  # type: ignore[attr-defined]  # an asyncpg Record
        concurrency_key=row.get("concurrency_key"),  # type: ignore[attr-defined]
        priority=row.get("priority"),  # type: ignore[attr-defined]
        incarnation=row.get("incarnation"),  # type: ignore[attr-defined]
    )
    return job_record(columns)


def unix(value: datetime | None) -> float | None:
    """A timestamptz as unix time; ``'infinity'`` and ``'-infinity'`` as those of the latest and earliest.

    asyncpg reads PostgreSQL's infinities as the naive ``datetime.max`` and ``datetime.min``: taken as UTC
    (as local time, the earliest is out of range and the row could not be read at all).
    """
    if value is None:
        return None
    return (value.replace(tzinfo=UTC) if value.tzinfo is None else value).timestamp()


#: The unix times `unix` gives PostgreSQL's ``'infinity'`` and ``'-infinity'``.
_LATEST, _EARLIEST = unix(datetime.max), unix(datetime.min)


def _page(
    t: TableNames,
    columns: str,
    status: bool,
    agent: bool,
    after: tuple[Any, str | bytes | None] | None,
    key: bool = False,
) -> tuple[Statement, dict[str, Any]]:
    """A `list_jobs` page's statement, and its cursor's parameters (checked first)."""
    cursor = (
        {} if after is None else {"after_at": cursor_timestamp(after[0]), "after_key": _text_key(after[1])}
    )
    return _page_sql(t, columns, status, agent, after is not None, key), cursor


@functools.cache
def _page_sql(t: TableNames, columns: str, status: bool, agent: bool, after: bool, key: bool) -> Sql:
    # One statement per shape, not ``:status IS NULL OR ...``: a generic plan of that form cannot use the
    # index range a page needs.
    filters = (("status = :status", status), ("agent_id = :agent_id", agent), ("concurrency_key = :key", key))
    clauses = [c for c, on in filters if on]
    if after:
        clauses.append("updated_at <= :after_at AND (updated_at < :after_at OR id > :after_key)")
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    return Sql.numbered(f"SELECT {columns} FROM {t.job}{where} ORDER BY updated_at DESC, id LIMIT :limit")


def cursor_timestamp(seconds: Any) -> datetime:
    """The timestamptz of a `list_jobs` cursor's unix time (a row's ``updated_at``), exactly.

    The exact microseconds: a float's own rounding must not skip or repeat a row. At or beyond what a
    datetime holds it is PostgreSQL's infinity (asyncpg writes the naive ``datetime.max`` as ``'infinity'``),
    the time `unix` reads such a row at, so the rows parked there are paged like any others.

    Raises:
        ValueError: ``seconds`` is not a number (not a cursor of this store).
    """
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds != seconds:
        raise ValueError("a PostgreSQL cursor's time is a number of seconds")
    assert _LATEST is not None and _EARLIEST is not None
    if seconds >= _LATEST:
        return datetime.max
    if seconds <= _EARLIEST:
        return datetime.min
    return _EPOCH + timedelta(microseconds=round(seconds * 1_000_000))


def _text_key(key: Any) -> str:
    """A cursor's id as a text parameter; `ValueError` for one no PostgreSQL text column holds."""
    if not isinstance(key, str) or "\x00" in key:
        raise ValueError("a PostgreSQL cursor's id is text without NUL")
    try:
        key.encode()
    except UnicodeEncodeError:
        raise ValueError("a PostgreSQL cursor's id is UTF-8 text") from None
    return key


# -- notifications: SQL text only, so that the statements can name them without the listener --------------

#: PostgreSQL refuses a payload of 8000 bytes or more; a longer agent id is sent as '' (wakes every waiter).
NOTIFY_PAYLOAD_LIMIT = 7900
_BASE_CHARS = 40  # the channel is an identifier: at most 63 bytes with the prefix and the OID
_END_BASE_CHARS = 34  # the same, with "_end"


def channel_prefix(t: TableNames) -> str:
    """``agentlife_<table>_``: the channel is this followed by the job table's OID."""
    return f"agentlife_{t.job.split('.')[-1][:_BASE_CHARS]}_"


def end_channel_prefix(t: TableNames) -> str:
    """``agentlife_<table>_end_``: the channel of the ends of jobs is this followed by the job table's OID.

    Never a channel of work (`channel_prefix`): a table whose name ends ``_end`` has another OID.
    """
    return f"agentlife_{t.job.split('.')[-1][:_END_BASE_CHARS]}_end_"


def notify_call(t: TableNames, agent_column: str = "agent_id") -> str:
    """The SQL ``pg_notify(channel, agent id)`` call, for a statement's RETURNING list or SELECT.

    The table name is a validated plain identifier (`TableNames`), safe inside the string literals.
    """
    channel = f"'{channel_prefix(t)}' || '{t.job}'::regclass::oid::text"
    payload = (
        f"CASE WHEN octet_length({agent_column}) < {NOTIFY_PAYLOAD_LIMIT} THEN {agent_column} ELSE '' END"
    )
    return f"pg_notify({channel}, {payload})"


#: The row carries a pause request (``paused.requested``).
_PAUSE_REQUESTED = "COALESCE((paused ->> 'requested') = 'true', false)"


def _pause_statements(j: str, cols: str, notify: str, keys: bool) -> dict[str, str]:
    """``job pause`` / ``job resume`` and the settling of a request (a table without ``paused``: no-ops)."""
    if not keys:  # `_pause` refuses to pause on such a table: nothing is ever paused or requested
        nothing = f"SELECT NULL FROM {j} WHERE false"
        return {"pause": nothing, "resume": nothing, "settle_pause": nothing, "pause_requested": nothing}
    runnable_due = f"status IN ({RUNNABLE_LIST}) AND {_DUE}"
    return {
        "pause": (
            f"UPDATE {j} SET status = :status, paused = :paused::jsonb, {_APPEND}, updated_at = now()"
            f" WHERE id = :job_id RETURNING {cols}"
        ),
        # A resumed runnable row that is due wakes the agent's idle workers.
        "resume": (
            f"UPDATE {j} SET status = :status, paused = NULL, {_APPEND}, updated_at = now(),"
            " not_before = CASE WHEN :wake THEN now() ELSE not_before END"
            f" WHERE id = :job_id RETURNING {cols}, CASE WHEN {runnable_due} THEN {notify} END AS notified"
        ),
        "settle_pause": (
            f"UPDATE {j} SET status = 'PAUSED', updated_at = now(),"
            " paused = (paused - 'requested') || jsonb_build_object('from', status)"
            f" WHERE id = :job_id AND {_PAUSE_REQUESTED} AND status IN ({SETTLES_PAUSE_SQL})"
        ),
        "pause_requested": (
            f"SELECT {_PAUSE_REQUESTED} FROM {j}"
            " WHERE id = :job_id AND attempt = :attempt AND status = 'RUNNING'"
        ),
    }
