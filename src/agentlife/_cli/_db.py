"""``python -m agentlife db init``: create the tables, idempotently."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from agentlife._cli._common import Parser
from agentlife._config import database_url_from_env
from agentlife._redact import Redactor
from agentlife.stores import SQLiteStore, store_from_url


def register(sub: Any) -> None:
    """Add ``db init`` to the subcommands."""
    db = sub.add_parser("db", help="database commands", description="Database commands.")
    db_sub = db.add_subparsers(dest="db_command", metavar="COMMAND", parser_class=Parser)
    db_sub.required = True
    init = db_sub.add_parser(
        "init",
        help="create the tables (idempotent)",
        description="Create the job, checkpoint_history, delivery and conversation tables if missing.",
    )
    init.add_argument("--database-url", help="default: AGENTLIFE_DATABASE_URL or the embedded SQLite file")
    init.set_defaults(handler=_cmd_db_init)


def _cmd_db_init(args: argparse.Namespace) -> int:
    import anyio

    url = args.database_url or database_url_from_env(os.environ)
    store = store_from_url(url)

    async def init() -> None:
        await store.open()
        try:
            await store.init_schema()
        finally:
            await store.close()

    anyio.run(init)
    where = Redactor.from_env(os.environ).redact(url)
    if isinstance(store, SQLiteStore):  # a relative sqlite:/// path surprises: say where the file is
        where += f" ({store.path.absolute()})"
    sys.stdout.write(f"schema ready at {where}\n")
    return 0
