"""The console over HTTP, with real processes: what it refuses (actions without the token, from another
origin, in the wrong order), what it never shows (secrets, markup), what it does with hostile requests and
a store that is not there, and the keyset paging it reads through (both stores)."""

from __future__ import annotations

import base64
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import anyio
import orjson
import pytest

from agentlife._journal._writer import EventType, Journal
from agentlife.stores import store_from_url
from consoles import TOKEN, insert_row, request, start_console, stop
from procs import agent_env, cli_in_process, run_cli


@pytest.fixture
def store_env(tmp_path: Path) -> dict[str, str]:
    db = tmp_path / "agentlife.db"
    env = agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=f"sqlite:///{db}")
    assert cli_in_process("db", "init", env=env).returncode == 0
    return env


@pytest.fixture
def console(store_env: dict[str, str]) -> Iterator[str]:
    proc, url = start_console({**store_env, "AGENTLIFE_CONSOLE_TOKEN": TOKEN}, "--allow-actions")
    yield url
    err = stop(proc)
    assert TOKEN not in err


def _job(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return cli_in_process("job", *args, env=env)


def _status(env: dict[str, str], job_id: str) -> tuple[str, int]:
    shown = _job(env, "list", "--json")
    rows = {r["id"]: r for r in map(orjson.loads, shown.stdout.splitlines())}
    return rows[job_id]["status"], rows[job_id]["attempt"]


def _act(url: str, job_id: str, action: str, **extra: str) -> tuple[int, str, dict[str, str]]:
    form = {"id": job_id, "action": action, "token": TOKEN, **extra}
    return request(url + "job/action", form)


# -- starting -------------------------------------------------------------------------------------------


def test_allow_actions_without_a_token_refuses_to_start_in_one_line(store_env: dict[str, str]) -> None:
    done = run_cli("console", "--allow-actions", "--port", "0", env=store_env)
    assert (done.returncode, done.stderr) == (
        2,
        "agentlife: error: --allow-actions needs a token in AGENTLIFE_CONSOLE_TOKEN\n",
    )
    short = run_cli("console", "--allow-actions", env={**store_env, "AGENTLIFE_CONSOLE_TOKEN": "abc"})
    assert short.returncode == 2 and "at least 16" in short.stderr and "abc" not in short.stderr
    port = run_cli("console", "--port", "70000", env=store_env)
    assert (port.returncode, port.stderr.count("\n")) == (2, 1)


# -- actions: the token, the origin, the order ----------------------------------------------------------


def test_an_action_without_the_token_or_from_another_origin_is_refused_and_changes_nothing(
    store_env: dict[str, str], console: str
) -> None:
    assert _job(store_env, "create", "demo", "--id", "job-a").returncode == 0
    before = _status(store_env, "job-a")
    form = {"id": "job-a", "action": "cancel"}
    refused = [
        request(console + "job/action", form),
        request(console + "job/action", {**form, "token": TOKEN[:-1] + "x"}),
        request(console + "job/action", {**form, "token": TOKEN + "x"}),
        request(console + "job/action", {**form, "token": TOKEN}, {"Origin": "https://evil.example"}),
        request(console + "job/action", {**form, "token": TOKEN}, {"Sec-Fetch-Site": "cross-site"}),
        request(console + "job/action", {**form, "token": TOKEN}, {"Origin": "null"}),
        # No page made it (an address typed, a bookmark, an extension): only same-origin passes.
        request(console + "job/action", {**form, "token": TOKEN}, {"Sec-Fetch-Site": "none"}),
        request(console + "job/action", {**form, "token": TOKEN}, {"Sec-Fetch-Site": "same-site"}),
    ]
    assert [r[0] for r in refused] == [403] * 8
    assert all(TOKEN not in r[1] for r in refused)
    got = request(console + "job/action?id=job-a&action=cancel&token=" + TOKEN)
    assert got[0] == 405
    assert _status(store_env, "job-a") == before
    # The same form from the console's own page (same origin) goes through.
    done = request(
        console + "job/action",
        {"id": "job-a", "action": "cancel", "token": TOKEN},
        {"Origin": console.rstrip("/"), "Sec-Fetch-Site": "same-origin"},
    )
    assert done[0] == 303 and done[2]["Location"].startswith("/job?id=job-a&done=cancel.FAILED.")
    assert _status(store_env, "job-a") == ("FAILED", 1)


def test_a_read_only_console_refuses_every_action(store_env: dict[str, str]) -> None:
    proc, url = start_console({**store_env, "AGENTLIFE_CONSOLE_TOKEN": TOKEN})
    try:
        assert _job(store_env, "create", "demo", "--id", "job-r").returncode == 0
        status, body, _ = _act(url, "job-r", "cancel")
        assert status == 403 and "Actions are off" in body
        page = request(url + "job?id=job-r")[1]
        assert "Console token" not in page and "read-only" in page
    finally:
        stop(proc)
    assert _status(store_env, "job-r") == ("PENDING", 0)


def test_operator_sequences_never_turn_a_no_into_a_yes(store_env: dict[str, str], console: str) -> None:
    assert _job(store_env, "create", "demo", "--id", "job-s").returncode == 0
    assert _act(console, "job-s", "approve", call="")[0] == 409  # not parked
    assert _act(console, "job-s", "retry")[0] == 409  # not failed
    assert _act(console, "job-s", "cancel", reason="stop <b>it</b>")[0] == 303
    twice = _act(console, "job-s", "cancel")  # a double submit
    assert twice[0] == 409 and "FAILED" in twice[1]
    assert _act(console, "job-s", "approve", call="")[0] == 409  # approve after the end
    assert _status(store_env, "job-s") == ("FAILED", 1)
    page = request(console + "job?id=job-s")[1]
    assert "stop &lt;b&gt;it&lt;/b&gt;" in page and "<b>it" not in page
    bad = _act(console, "job-s", "cancel", reason="line\nbreak")
    assert bad[0] in (400, 409)
    assert _act(console, "job-s", "explode")[0] == 400
    assert _act(console, "no-such-job", "cancel")[0] == 404
    assert _act(console, "job-s", "retry")[0] == 303
    assert _status(store_env, "job-s") == ("PENDING", 1)


def test_pause_and_resume_from_the_page(store_env: dict[str, str], console: str) -> None:
    assert _job(store_env, "create", "demo", "--id", "job-p").returncode == 0
    page = request(console + "job?id=job-p")[1]
    assert 'value="pause">Pause</button>' in page and 'value="resume"' not in page
    assert _act(console, "job-p", "resume")[0] == 409  # not paused
    assert _act(console, "job-p", "pause", reason="x" * 10_000)[0] == 400
    assert _status(store_env, "job-p") == ("PENDING", 0)
    done = _act(console, "job-p", "pause", reason="db <migration>")
    assert done[0] == 303 and done[2]["Location"].startswith("/job?id=job-p&done=pause.PAUSED.")
    page = request(console + "job?id=job-p")[1]
    assert 'value="resume">Resume</button>' in page and 'value="pause"' not in page
    assert "db &lt;migration&gt;" in page and "<migration>" not in page
    assert _act(console, "job-p", "pause")[0] == 409  # a double submit
    assert _act(console, "job-p", "resume")[0] == 303
    assert _status(store_env, "job-p") == ("PENDING", 0)


def test_an_approval_grants_the_call_the_page_showed_and_nothing_when_it_showed_none(
    store_env: dict[str, str], console: str
) -> None:
    # A row parked with no readable request (set by hand, by another tool) shows no call; the job then asks
    # for one. The form as it was drawn, or one without the field, must not grant a call nobody saw.
    db = Path(store_env["AGENTLIFE_DATABASE_URL"].removeprefix("sqlite:///"))
    insert_row(db, "a1", "demo", None, "WAITING_FOR_APPROVAL", approval="{bad")
    page = request(console + "job?id=a1")[1]
    assert '<input type="hidden" name="call" value="">' in page  # the page says it showed no call
    asked = {"request": {"invocation_id": "a1/0/0", "digest": "d0", "tool": "deploy", "at": time.time()}}
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("UPDATE job SET approval = ? WHERE id = 'a1'", (orjson.dumps(asked).decode(),))
    finally:
        conn.close()
    refused = _act(console, "a1", "approve", call="")
    assert refused[0] == 409 and "a call not shown" in refused[1], refused[1]
    assert _act(console, "a1", "approve")[0] == 400  # no call field: not the page's form
    assert _status(store_env, "a1") == ("WAITING_FOR_APPROVAL", 0)
    assert _act(console, "a1", "approve", call="a1/0/0")[0] == 303  # the page that shows it grants it
    assert _status(store_env, "a1")[0] == "PENDING"


def test_filter_values_the_list_echoes_are_masked_like_the_store_s(console: str) -> None:
    # A value typed into the filter (or a crafted link) is drawn back into the form and the caption: it is
    # shown through the same masking as everything read from the store.
    token = "ghp_" + "Q7w" * 12
    page = request(console + "?" + urlencode({"agent": token, "id": "password=Hunter2Secret"}))[1]
    assert token not in page and "Hunter2Secret" not in page
    assert "No job with id password=***" in page


# -- hostile requests -------------------------------------------------------------------------------------


def test_hostile_requests_get_a_clear_4xx(store_env: dict[str, str], console: str) -> None:
    cases = {
        "job?id=nope": 404,
        "job?id=..%2F..%2Fetc%2Fpasswd": 404,
        "job": 400,
        "job?id=a%00b": 400,
        "job?id=" + "x" * 600: 400,
        "?after=not-a-cursor": 400,
        "?after=" + "A" * 2000: 400,
        "?after=WzEuMCwxXQ": 400,  # [1.0,1]: right shape, id not text
        "?after=WzFlOTk5LCJhIl0": 400,  # 1e999: not finite
        "?after=~not-one-it-kept": 400,  # a long cursor this console never kept (or forgot at a restart)
        "?after=" + _cursor(["n", 1.0, "b", "@@not base64"]): 400,
        "?after=" + _cursor(["n", "nan", "s", "a"]): 400,
        "?after=" + _cursor(["n", 1.0, "s"]): 400,
        "?after=" + _cursor(["n", 1e300, "s", "a"]): 200,  # far in the future: every row follows it
        "?status=NOPE": 400,
        "?x=" + "y" * 5000: 414,
        "static/..%2F_server.py": 404,
        "static/nothing.js": 404,
        "job/state?id=nope": 404,
    }
    for path, expected in cases.items():
        status, body, headers = request(console + path)
        assert status == expected, (path, status, body[:200])
        assert "Traceback" not in body
        assert headers.get("X-Content-Type-Options") == "nosniff", path
    too_big = request(console + "job/action", {"id": "x", "action": "cancel", "token": "t" * 100_000})
    assert too_big[0] == 413


def _cursor(value: list[Any]) -> str:
    """A paging cursor written by hand, in the console's format."""
    return base64.urlsafe_b64encode(orjson.dumps(value)).decode().rstrip("=")


def test_every_page_carries_the_security_headers(console: str) -> None:
    for path in ("", "job?id=nope", "static/console.js", "static/console.css"):
        headers = request(console + path)[2]
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        assert "unsafe-inline" not in headers["Content-Security-Policy"]
        assert headers["X-Frame-Options"] == "DENY"


def test_secrets_in_a_payload_are_masked_and_a_huge_one_is_bounded(store_env: dict[str, str]) -> None:
    secret = "s3cr3t-v4lue-from-the-env"
    env = {**store_env, "BILLING_API_KEY": secret}
    payload = {
        "note": f"the key is {secret}",
        "password": "hunter2 with spaces",
        "dsn": "postgresql://bob:p%40ss%20w0rd@db/x",
        "auth": "Bearer abcdefghijklmnop",
        "big": "A" * 1_000_000,
    }
    db = Path(store_env["AGENTLIFE_DATABASE_URL"].removeprefix("sqlite:///"))
    insert_row(db, "job-secret", "demo", payload)
    proc, url = start_console(env)
    try:
        status, page, _ = request(url + "job?id=job-secret")
    finally:
        stop(proc)
    assert status == 200
    for leaked in (secret, "hunter2", "p%40ss%20w0rd", "abcdefghijklmnop"):
        assert leaked not in page, leaked
    assert len(page) < 200_000
    assert "more characters" in page


def test_a_store_that_is_not_there_is_a_503_page_and_one_that_comes_back_is_read(tmp_path: Path) -> None:
    db = tmp_path / "later.db"
    env = agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=f"sqlite:///{db}")
    proc, url = start_console(env)
    try:
        status, body, _ = request(url)
        assert status == 503 and "no store at" in body and "Traceback" not in body
        assert not db.exists()  # the console never creates a store
        assert cli_in_process("db", "init", env=env).returncode == 0
        assert cli_in_process("job", "create", "demo", "--id", "job-back", env=env).returncode == 0
        status, body, _ = request(url)
        assert status == 200 and "job-back" in body
    finally:
        stop(proc)


# -- keyset paging, on both stores ------------------------------------------------------------------------


def test_a_cursor_lists_what_follows_it_in_the_console(store_env: dict[str, str], console: str) -> None:
    db = Path(store_env["AGENTLIFE_DATABASE_URL"].removeprefix("sqlite:///"))
    for n in range(120):
        insert_row(db, f"row-{n:03d}", "bulk", {"n": n})
    seen: list[str] = []
    path = ""
    for _ in range(5):
        body = request(console + path)[1]
        seen += [part.split('"', 1)[0] for part in body.split('href="/job?id=')[1:]]
        if 'rel="next"' not in body:
            break
        path = body.split('rel="next" href="/', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    assert sorted(seen) == [f"row-{n:03d}" for n in range(120)]
    assert len(seen) == 120


def test_cancel_from_the_page_cancels_the_children_as_job_cancel_does(
    store_env: dict[str, str], console: str
) -> None:
    url = store_env["AGENTLIFE_DATABASE_URL"]

    async def family() -> None:
        store = store_from_url(url)
        await store.open()
        try:
            await store.create_job("p", "family", None)
            await store.claim("p", 1)
            await store.start_child("p", 1, "p.0.1", "kid", {"n": 1}, invocation_id="p/0/1")
            await store.start_child("p", 1, "p.0.2", "kid", {"n": 2}, invocation_id="p/0/2", detached=True)
        finally:
            await store.close()

    anyio.run(family)
    assert _act(console, "p", "cancel")[0] == 303
    assert _status(store_env, "p")[0] == "FAILED"
    assert _status(store_env, "p.0.1")[0] == "FAILED"  # cancelled with its parent
    assert _status(store_env, "p.0.2")[0] == "PENDING"  # started detached: it lives on


#: More rows than one page of the console (50), most of them sharing one ``updated_at`` (a bulk insert).
TIED = 40
LONG_ID = "L" * 2999


def _plant_awkward_rows(url: str) -> None:
    """Rows another client wrote: ids the stores read and set aside, times at the edges, long ids, ties."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        tie = time.time()
        try:
            rows: list[tuple[Any, Any]] = [(f"tie-{n:02d}", tie) for n in range(TIED)]
            rows += [
                (b"job-1", tie),  # a BLOB id with the bytes of a text id that also exists
                ("job-1", tie),
                (b"\x00\xff\x01", tie),
                (None, tie),  # SQLite's PRIMARY KEY lets a NULL in
                (LONG_ID, tie),
                (LONG_ID + "M", tie),
                ("text-time", "not a number"),  # a REAL column holding text
                ("older", tie - 10),
            ]
            for job_id, at in rows:
                conn.execute(
                    "INSERT INTO job (id, agent_id, status, payload, attempt, updated_at)"
                    " VALUES (?, 'bulk', 'PENDING', '{}', 0, ?)",
                    (job_id, at),
                )
            for raw in (b"\xff\x41", b"tie-\xff", b"tie-\xc3"):  # text that is not UTF-8
                conn.execute(
                    "INSERT INTO job (id, agent_id, status, payload, attempt, updated_at)"
                    " VALUES (CAST(? AS TEXT), 'bulk', 'PENDING', '{}', 0, ?)",
                    (raw, tie),
                )
        finally:
            conn.close()
        return

    async def write() -> None:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            ids = [f"tie-{n:02d}" for n in range(TIED)] + ["ü-1", "😀-2", "Z", "a b", LONG_ID, LONG_ID + "M"]
            await conn.execute(  # one statement: one now() for every row, a tie of them all
                "INSERT INTO job (id, agent_id, status, payload, attempt, updated_at)"
                " SELECT unnest($1::text[]), 'bulk', 'PENDING', '{}', 0, now()",
                ids,
            )
            for n in range(6):  # parked for ever, or since before time, by another client
                at = "infinity" if n % 2 else "-infinity"
                await conn.execute(
                    "INSERT INTO job (id, agent_id, status, payload, attempt, updated_at)"
                    f" VALUES ($1, 'bulk', 'PENDING', '{{}}', 0, '{at}')",
                    f"edge-{n}",
                )
        finally:
            await conn.close()

    anyio.run(write)


def test_older_jobs_shows_every_row_once_whatever_its_id_or_time(db_url: str, tmp_path: Path) -> None:
    env = agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=db_url)
    assert cli_in_process("db", "init", env=env).returncode == 0
    _plant_awkward_rows(db_url)

    async def expected() -> list[str]:
        store = store_from_url(db_url)
        await store.open()
        try:
            return [urlencode({"id": r.id}) for r in await store.list_jobs(limit=10_000)]
        finally:
            await store.close()

    links = anyio.run(expected)
    proc, url = start_console(env)
    try:
        seen: list[str] = []
        path = ""
        for _ in range(len(links)):  # "Older jobs" that never ends would loop for ever
            status, body, _ = request(url + path)
            assert status == 200, body[-600:]
            seen += [part.split('"', 1)[0].replace("&amp;", "&") for part in body.split('href="/job?')[1:]]
            if 'rel="next"' not in body:
                break
            path = body.split('rel="next" href="/', 1)[1].split('"', 1)[0].replace("&amp;", "&")
        # Cursors written by hand: a time past any a datetime holds, and an id PostgreSQL cannot hold.
        assert request(url + "?after=" + _cursor(["n", 1e300, "s", "a"]))[0] == 200
        blob = request(url + "?after=" + _cursor(["n", 1e300, "b", "AP8="]))
        assert blob[0] == (200 if db_url.startswith("sqlite") else 400)
    finally:
        err = stop(proc)
    assert seen == links
    assert len(seen) > 50  # more than one page
    assert "Traceback" not in err and "internal error" not in err


# -- journals written by someone else -------------------------------------------------------------------


def test_a_job_whose_process_was_killed_while_booting_has_a_page(
    store_env: dict[str, str], console: str
) -> None:
    assert _job(store_env, "create", "demo", "--id", "boot-1").returncode == 0

    async def journal() -> None:  # killed before its first LIFECYCLE line
        sessions = Path(store_env["AGENTLIFE_DATA_DIR"]) / "sessions" / "boot-1"
        writer = Journal.create(sessions, 1)
        writer.append(EventType.SESSION_STARTED, attempt=1, pid=4242)
        await writer.aclose()

    anyio.run(journal)
    status, body, _ = request(console + "job?id=boot-1")
    assert status == 200, body[-500:]
    assert "attempt 1 started (pid 4242)" in body and "crashed or killed" in body


# -- what a page says after an action ---------------------------------------------------------------------


def test_a_done_link_shows_only_what_the_store_recorded(store_env: dict[str, str], console: str) -> None:
    for job_id in ("job-f", "job-g"):
        assert _job(store_env, "create", "demo", "--id", job_id).returncode == 0
    crafted = request(console + "job?id=job-f&done=approve")[1]
    assert 'class="flash"' not in crafted and "Approved" not in crafted
    status, _, headers = _act(console, "job-f", "cancel")
    assert status == 303
    where = headers["Location"]
    page = request(console + where.lstrip("/"))[1]
    flash = page.split('class="flash"', 1)[1].split("</p>", 1)[0]
    assert "Cancelled" in flash and "the job was then FAILED" in flash
    forged = [
        where.replace("id=job-f", "id=job-g"),  # another job's page
        where.replace("cancel.FAILED", "approve.FAILED"),
        where.replace("cancel.FAILED", "cancel.COMPLETED"),
        where[:-2] + ("AA" if not where.endswith("AA") else "BB"),
    ]
    for link in forged:
        body = request(console + link.lstrip("/"))[1]
        assert 'class="flash"' not in body, link
