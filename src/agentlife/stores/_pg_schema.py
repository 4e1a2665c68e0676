"""The PostgreSQL store's schema: the tables every store shares, plus what the job, wait and event ops add."""

from __future__ import annotations

from agentlife.stores._base import TableNames
from agentlife.stores._childjobs import pg_child_schema
from agentlife.stores._events import pg_event_schema
from agentlife.stores._pg_jobs import pg_job_schema
from agentlife.stores._steprecords import pg_step_record_schema
from agentlife.stores._waits import pg_wait_schema

__all__ = ["pg_schema"]


def pg_schema(t: TableNames) -> tuple[str, ...]:
    """Every ``CREATE ... IF NOT EXISTS`` of the PostgreSQL store, in order (`PostgresStore.init_schema`)."""
    schemas = sorted(
        {
            name.split(".")[0]
            for name in (t.job, t.checkpoint_history, t.delivery, t.conversation, t.event, t.step_record)
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
        *pg_job_schema(t),
        *pg_wait_schema(t),
        *pg_event_schema(t),
        *pg_child_schema(t),
        *pg_step_record_schema(t),
    )
