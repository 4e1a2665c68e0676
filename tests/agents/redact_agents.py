"""Agents for the masking end-to-end tests (tests/e2e/test_redaction.py): large results, leaky URLs.

Marker files live in ``TEST_MARKER_DIR``.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path
from typing import Any

from agentlife import AgentProcess, Done, StepContext, tool

log = logging.getLogger("agents.redact")


def _marker(name: str) -> Path:
    return Path(os.environ["TEST_MARKER_DIR"], name)


@tool(side_effects=False, timeout=120)
async def hex_blob(size: int, call: int) -> str:
    """``size`` random hex characters: letters and digits, the run that made masking quadratic."""
    return secrets.token_hex(size // 2)


class HexFloodAgent(AgentProcess):
    """One step: tools returning 1 MB of hex, one after the other, until the test creates ``go``.

    ``called-N`` is touched after the N-th result came back (journaled and masked), so the test knows the
    loop is busy with those results while it probes ``/healthz``.
    """

    agent_id = "hex-flood"

    async def step(self, ctx: StepContext) -> Done | None:
        size = int(os.environ.get("TEST_HEX_BYTES", "1000000"))
        call = 0
        while not _marker("go").exists():
            blob = await ctx.call_tool(hex_blob, size=size, call=call)
            log.info("tool %d returned %d characters, ending %s", call, len(blob), blob[-16:])
            _marker(f"called-{call}").touch()
            call += 1
        return Done(result={"calls": call})


@tool(side_effects=True)
async def echo_database_url() -> dict[str, Any]:
    """What a careless tool returns: the connection URL and its password, in several spellings."""
    url = os.environ["AGENTLIFE_DATABASE_URL"]
    password = os.environ["TEST_DB_SPELLED_OUT"]
    return {"url": url, "password": password, "quoted": repr(url), "said": f"logged in with {password}"}


class LeakyDatabaseUrlAgent(AgentProcess):
    """One step that prints its database URL every careless way, then ``Done``.

    It logs the URL and the password (``%s`` and ``%r``), journals a tool result holding them, and logs an
    exception whose message and traceback quote the URL.
    """

    agent_id = "leaky-db-url"

    async def step(self, ctx: StepContext) -> Done | None:
        url = os.environ["AGENTLIFE_DATABASE_URL"]
        password = os.environ["TEST_DB_SPELLED_OUT"]
        log.info("database is %s, password %s, quoted %r", url, password, password)
        await ctx.call_tool(echo_database_url)
        try:
            raise ConnectionError(f"cannot connect to {url!r} with password {password!r}")
        except ConnectionError:
            log.exception("connecting by hand failed")
        return Done(result={"ok": True})
