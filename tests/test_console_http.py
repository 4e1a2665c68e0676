"""The console over HTTP, with real processes: what it refuses (actions without the token, from another
origin, in the wrong order), what it never shows (secrets, markup), what it does with hostile requests and
a store that is not there, and the keyset paging it reads through (both stores)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import orjson
import pytest

from agentlife.stores import store_from_url
from consoles import TOKEN, insert_row, request, start_console, stop
from procs import agent_env, run_cli


@pytest.fixture
def store_env(tmp_path: Path) -> dict[str, str]:
    db = tmp_path / "agentlife.db"
    env = agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=f"sqlite:///{db}")
    assert run_cli("db", "init", env=env).returncode == 0
    return env


@pytest.fixture
def console(store_env: dict[str, str]) -> Iterator[str]:
    proc, url = start_console({**store_env, "AGENTLIFE_CONSOLE_TOKEN": TOKEN}, "--allow-actions")
    yield url
    err = stop(proc)
    assert TOKEN not in err


def _job(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("job", *args, env=env)


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
    ]
    assert [r[0] for r in refused] == [403] * 6
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
    assert done[0] == 303 and done[2]["Location"] == "/job?id=job-a&done=cancel"
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
    assert _act(console, "job-s", "approve")[0] == 409  # not parked
    assert _act(console, "job-s", "retry")[0] == 409  # not failed
    assert _act(console, "job-s", "cancel", reason="stop <b>it</b>")[0] == 303
    twice = _act(console, "job-s", "cancel")  # a double submit
    assert twice[0] == 409 and "FAILED" in twice[1]
    assert _act(console, "job-s", "approve")[0] == 409  # approve after the end
    assert _status(store_env, "job-s") == ("FAILED", 1)
    page = request(console + "job?id=job-s")[1]
    assert "stop &lt;b&gt;it&lt;/b&gt;" in page and "<b>it" not in page
    bad = _act(console, "job-s", "cancel", reason="line\nbreak")
    assert bad[0] in (400, 409)
    assert _act(console, "job-s", "explode")[0] == 400
    assert _act(console, "no-such-job", "cancel")[0] == 404
    assert _act(console, "job-s", "retry")[0] == 303
    assert _status(store_env, "job-s") == ("PENDING", 1)


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
        assert run_cli("db", "init", env=env).returncode == 0
        assert run_cli("job", "create", "demo", "--id", "job-back", env=env).returncode == 0
        status, body, _ = request(url)
        assert status == 200 and "job-back" in body
    finally:
        stop(proc)


# -- keyset paging, on both stores ------------------------------------------------------------------------


def test_list_jobs_pages_by_cursor_without_skipping_or_repeating_ties(db_url: str) -> None:
    async def go() -> None:
        store = store_from_url(db_url)
        await store.open()
        try:
            await store.init_schema()
            for n in range(23):
                await store.create_job(f"page-{n:02d}", "pager" if n % 2 else "other", {"n": n})
            rows = await store.list_jobs(limit=1000)
            ids = [r.id for r in rows if r.id.startswith("page-")]
            seen: list[str] = []
            after = None
            while True:
                page = await store.list_jobs(None, None, 5, after=after)
                page = [r for r in page if r.id.startswith("page-")]
                if not page:
                    break
                seen += [r.id for r in page]
                last = page[-1]
                assert last.updated_at is not None
                after = (last.updated_at, last.id)
            assert seen == ids and len(set(seen)) == 23
            filtered = await store.list_jobs(None, "pager", 100, after=None)
            assert [r.id for r in filtered] == [i for i in ids if int(i[-2:]) % 2]
        finally:
            await store.close()

    anyio.run(go)


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
