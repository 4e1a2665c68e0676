"""PostgreSQL's schema (``db init``): the tables every store shares, and what each concern adds."""

from __future__ import annotations

from agentlife.stores._base import TableNames
from agentlife.stores._dialect import RUNNABLE_SQL, TERMINAL_SQL
from agentlife.stores._output_sql import pg_output_schema
from agentlife.stores._pg_statements import NOTIFY_PAYLOAD_LIMIT, end_channel_prefix, notify_call

__all__ = ["pg_schema"]


def pg_schema(t: TableNames) -> tuple[str, ...]:
    """Every ``CREATE ... IF NOT EXISTS`` of the PostgreSQL store, in order (`PostgresStore.init_schema`)."""
    schemas = sorted(
        {
            name.split(".")[0]
            for name in (
                t.job,
                t.checkpoint_history,
                t.delivery,
                t.conversation,
                t.event,
                t.step_record,
                t.rate_bucket,
                t.output,
                t.pruned,
            )
            if "." in name
        }
    )
    history_index = t.checkpoint_history.split(".")[-1] + "_job_created_idx"
    return (
        *(f"CREATE SCHEMA IF NOT EXISTS {schema}" for schema in schemas),
        f"""CREATE TABLE IF NOT EXISTS {t.job} (
            id text PRIMARY KEY,
            agent_id text NOT NULL,
            status text NOT NULL DEFAULT 'PENDING',
            payload jsonb,
            attempt integer NOT NULL DEFAULT 0,
            checkpoint bytea,
            checkpoint_crc bigint,
            checkpoint_id text,
            heartbeat_at timestamptz,
            tokens_consumed jsonb NOT NULL DEFAULT '{{"input": 0, "output": 0, "cost_usd": 0.0}}',
            token_budget jsonb,
            error jsonb NOT NULL DEFAULT '[]',
            result jsonb,
            updated_at timestamptz NOT NULL DEFAULT now(),
            owner text
        )""",
        # The claim token, added to a job table made before it existed (or by a control plane).
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS owner text",
        f"""CREATE TABLE IF NOT EXISTS {t.checkpoint_history} (
            job_id text NOT NULL,
            checkpoint_id text NOT NULL,
            step integer NOT NULL,
            checkpoint bytea NOT NULL,
            crc bigint NOT NULL,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (job_id, checkpoint_id)
        )""",
        f"CREATE INDEX IF NOT EXISTS {history_index} ON {t.checkpoint_history} (job_id, created_at DESC)",
        f"""CREATE TABLE IF NOT EXISTS {t.delivery} (
            key text PRIMARY KEY,
            job_id text NOT NULL,
            channel text NOT NULL,
            delivered_at timestamptz NOT NULL DEFAULT now()
        )""",
        f"""CREATE TABLE IF NOT EXISTS {t.conversation} (
            job_id text NOT NULL, seq integer NOT NULL, step integer NOT NULL, message bytea NOT NULL,
            PRIMARY KEY (job_id, seq)
        )""",
        *_rate_schema(t),
        *_job_schema(t),
        *_wait_schema(t),
        *_event_schema(t),
        *_child_schema(t),
        *_step_record_schema(t),
        *_end_schema(t),
        *_key_schema(t),
        *pg_output_schema(t),
        *_prune_schema(t),
    )


def _prune_schema(t: TableNames) -> tuple[str, ...]:
    """The tombstones of pruned jobs, and the index a prune's delete of a job's deliveries uses (``db init``).

    ``delivery`` was keyed by its key alone: deleting a job's rows would read the whole table per batch.
    """
    pbase, dbase = t.pruned.split(".")[-1], t.delivery.split(".")[-1]
    return (
        f"""CREATE TABLE IF NOT EXISTS {t.pruned} (
            id text PRIMARY KEY,
            agent_id text NOT NULL,
            status text NOT NULL,
            finished_at timestamptz NOT NULL,
            pruned_at timestamptz NOT NULL DEFAULT now()
        )""",
        f"CREATE INDEX IF NOT EXISTS {pbase}_at_idx ON {t.pruned} (pruned_at)",
        f"CREATE INDEX IF NOT EXISTS {dbase}_job_idx ON {t.delivery} (job_id)",
    )


def _rate_schema(t: TableNames) -> tuple[str, ...]:
    """The rate-limit buckets and in-flight slots (PostgreSQL); times are unix seconds, as the callers'."""
    slot_index = t.rate_slot.split(".")[-1] + "_key_idx"
    return (
        f"""CREATE TABLE IF NOT EXISTS {t.rate_bucket} (
            key text PRIMARY KEY,
            requests double precision,
            input_tokens double precision,
            output_tokens double precision,
            updated_at double precision NOT NULL,
            paused_until double precision NOT NULL DEFAULT 0
        )""",
        f"""CREATE TABLE IF NOT EXISTS {t.rate_slot} (
            id text PRIMARY KEY,
            key text NOT NULL,
            expires_at double precision NOT NULL
        )""",
        f"CREATE INDEX IF NOT EXISTS {slot_index} ON {t.rate_slot} (key, expires_at)",
    )


def _job_schema(t: TableNames) -> tuple[str, ...]:
    """The ``not_before`` and ``approval`` columns (added to an older table too), the runnable-job indexes."""
    schema, _, base = t.job.rpartition(".")
    prefix = f"{schema}." if schema else ""
    return (
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS not_before timestamptz DEFAULT now()",
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS approval jsonb",
        # An operator's pause: the status it was paused in, or a RUNNING row's request for its process.
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS paused jsonb",
        # The indexes before WAITING was runnable: their predicate no longer matches the claim's.
        f"DROP INDEX IF EXISTS {prefix}{base}_runnable_idx",
        f"DROP INDEX IF EXISTS {prefix}{base}_agent_runnable_idx",
        f"CREATE INDEX IF NOT EXISTS {base}_agent_due_idx ON {t.job}"
        f" (agent_id, not_before NULLS FIRST, id) WHERE {RUNNABLE_SQL}",
        # `list_jobs` pages by (updated_at, id) from a cursor: each of its orders is one index range.
        f"CREATE INDEX IF NOT EXISTS {base}_listed_idx ON {t.job} (updated_at DESC, id)",
        f"CREATE INDEX IF NOT EXISTS {base}_status_listed_idx ON {t.job} (status, updated_at DESC, id)",
        f"CREATE INDEX IF NOT EXISTS {base}_agent_listed_idx ON {t.job} (agent_id, updated_at DESC, id)",
    )


def _wait_schema(t: TableNames) -> tuple[str, ...]:
    """The ``waiting`` column (added to an older table too, by ``db init``)."""
    return (f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS waiting jsonb",)


def _event_schema(t: TableNames) -> tuple[str, ...]:
    """The event table and its index (PostgreSQL, by ``db init``)."""
    base = t.event.split(".")[-1]
    return (
        f"""CREATE TABLE IF NOT EXISTS {t.event} (
            seq bigserial PRIMARY KEY,
            job_id text NOT NULL,
            name text NOT NULL,
            payload jsonb,
            sent_at timestamptz NOT NULL DEFAULT now(),
            taken_by text
        )""",
        f"CREATE INDEX IF NOT EXISTS {base}_job_name_idx ON {t.event} (job_id, name, seq)",
    )


def _child_schema(t: TableNames) -> tuple[str, ...]:
    """The columns, the parent index, and the trigger that wakes a parent (``db init``)."""
    schema, _, base = t.job.rpartition(".")
    prefix = f"{schema}." if schema else ""
    function = f"{prefix}agentlife_{base}_child_ended"
    body = f"""
        DECLARE woke text;
        BEGIN
            -- The parent's row lock first: a sibling ending at the same time waits, then sees this one.
            PERFORM 1 FROM {t.job} WHERE id = NEW.parent_id FOR UPDATE;
            UPDATE {t.job} AS p SET not_before = now()
            WHERE p.id = NEW.parent_id AND p.status = 'WAITING'
                AND jsonb_typeof(p.waiting -> 'jobs') = 'array' AND (p.waiting -> 'jobs') ? NEW.id
                AND NOT EXISTS (
                    SELECT 1 FROM {t.job} AS c
                    WHERE c.id IN (SELECT jsonb_array_elements_text(p.waiting -> 'jobs'))
                        AND c.status NOT IN ({TERMINAL_SQL})
                )
            RETURNING p.agent_id INTO woke;
            IF woke IS NOT NULL THEN
                PERFORM {notify_call(t, "woke")};
            END IF;
            RETURN NULL;
        END"""
    return (
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS parent_id text",
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS spawned_by text",
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS detached boolean NOT NULL DEFAULT false",
        f"CREATE INDEX IF NOT EXISTS {base}_parent_idx ON {t.job} (parent_id) WHERE parent_id IS NOT NULL",
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql"
        f" AS $agentlife${body}$agentlife$",
        f"DROP TRIGGER IF EXISTS {base}_child_ended ON {t.job}",
        f"CREATE TRIGGER {base}_child_ended AFTER UPDATE OF status ON {t.job} FOR EACH ROW"
        f" WHEN (NEW.parent_id IS NOT NULL AND NEW.status IN ({TERMINAL_SQL})"
        " AND OLD.status IS DISTINCT FROM NEW.status)"
        f" EXECUTE FUNCTION {function}()",
    )


def _step_record_schema(t: TableNames) -> tuple[str, ...]:
    """The ``step_record`` table (PostgreSQL, by ``db init``)."""
    return (
        f"""CREATE TABLE IF NOT EXISTS {t.step_record} (
            job_id text NOT NULL,
            step integer NOT NULL,
            attempt integer NOT NULL,
            session bigint NOT NULL,
            seq integer NOT NULL,
            data bytea NOT NULL,
            PRIMARY KEY (job_id, step, attempt, session, seq)
        )""",
    )


def _end_schema(t: TableNames) -> tuple[str, ...]:
    """The trigger that announces a job's end to `agentlife.Client.result` waits (``db init``).

    A trigger, not the statements: every writer of a terminal status (the finisher, the reaper, an
    operator's cancel or reject, a control plane's own UPDATE) announces it, in the same transaction.
    The payload is the job id ('' for one too long for a notification: every waiter reads its row again).
    """
    schema, _, base = t.job.rpartition(".")
    prefix = f"{schema}." if schema else ""
    function = f"{prefix}agentlife_{base}_job_ended"
    channel = f"'{end_channel_prefix(t)}' || '{t.job}'::regclass::oid::text"
    payload = f"CASE WHEN octet_length(NEW.id) < {NOTIFY_PAYLOAD_LIMIT} THEN NEW.id ELSE '' END"
    body = f"""
        BEGIN
            PERFORM pg_notify({channel}, {payload});
            RETURN NULL;
        END"""
    return (
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql"
        f" AS $agentlife${body}$agentlife$",
        f"DROP TRIGGER IF EXISTS {base}_job_ended ON {t.job}",
        f"CREATE TRIGGER {base}_job_ended AFTER UPDATE OF status ON {t.job} FOR EACH ROW"
        f" WHEN (NEW.status IN ({TERMINAL_SQL}) AND OLD.status IS DISTINCT FROM NEW.status)"
        f" EXECUTE FUNCTION {function}()",
    )


def _key_schema(t: TableNames) -> tuple[str, ...]:
    """Concurrency keys and priority: the columns, the claim's indexes and the running slots (``db init``).

    A worker's claim with running limits gives the row a slot (1 to the limit) of its key and of its agent;
    the unique indexes on the RUNNING rows' slots refuse a second claim of a slot that a concurrent claim
    just took (`agentlife.stores._claims`), so a limit holds even between claims whose snapshots overlap.
    """
    schema, _, base = t.job.rpartition(".")
    prefix = f"{schema}." if schema else ""
    # A slot freed wakes the agent's idle workers, whose claims the full key held back (on commit, as the
    # insert of a runnable row does); a row that held no slot (no limits) notifies nobody.
    function = f"{prefix}agentlife_{base}_slot_freed"
    body = f"""
        BEGIN
            PERFORM {notify_call(t, "NEW.agent_id")};
            RETURN NULL;
        END"""
    return (
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS concurrency_key text",
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS priority integer NOT NULL DEFAULT 0",
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS key_slot integer",
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS agent_slot integer",
        # Which creation of the id the row is (random per creation): a journal of another is never replayed.
        f"ALTER TABLE {t.job} ADD COLUMN IF NOT EXISTS incarnation text",
        # The claim's order is now (priority DESC, not_before, id): the index of any agent's claim follows
        # it; the agent's one stays beside the old (agent, not_before) index, which finds the next due time.
        f"DROP INDEX IF EXISTS {prefix}{base}_due_idx",
        f"CREATE INDEX IF NOT EXISTS {base}_claim_idx ON {t.job}"
        f" (priority DESC, not_before NULLS FIRST, id) WHERE {RUNNABLE_SQL}",
        f"CREATE INDEX IF NOT EXISTS {base}_agent_claim_idx ON {t.job}"
        f" (agent_id, priority DESC, not_before NULLS FIRST, id) WHERE {RUNNABLE_SQL}",
        # The first runnable row of a key (the limited claim takes no other of a limited key).
        f"CREATE INDEX IF NOT EXISTS {base}_key_claim_idx ON {t.job}"
        f" (concurrency_key, priority DESC, not_before NULLS FIRST, id)"
        f" WHERE {RUNNABLE_SQL} AND concurrency_key IS NOT NULL",
        f"CREATE UNIQUE INDEX IF NOT EXISTS {base}_key_slot_idx ON {t.job} (concurrency_key, key_slot)"
        " WHERE status = 'RUNNING' AND key_slot IS NOT NULL",
        f"CREATE UNIQUE INDEX IF NOT EXISTS {base}_agent_slot_idx ON {t.job} (agent_id, agent_slot)"
        " WHERE status = 'RUNNING' AND agent_slot IS NOT NULL",
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql"
        f" AS $agentlife${body}$agentlife$",
        f"DROP TRIGGER IF EXISTS {base}_slot_freed ON {t.job}",
        f"CREATE TRIGGER {base}_slot_freed AFTER UPDATE OF status ON {t.job} FOR EACH ROW"
        " WHEN (OLD.status = 'RUNNING' AND NEW.status IS DISTINCT FROM 'RUNNING'"
        " AND (OLD.key_slot IS NOT NULL OR OLD.agent_slot IS NOT NULL))"
        f" EXECUTE FUNCTION {function}()",
    )
