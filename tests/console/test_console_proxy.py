"""The console for an on-call shift, in-process over a real aiohttp server and httpx: under a base path,
with forwarded headers trusted only from configured peers, the overview (its counts equal to ``job list``'s),
the approval's arguments and the model's text (masked), parent and child links, and the journal download
(masked, only of a session file on the console's disk). The browser behind a real proxy is in
tests/e2e/test_console_proxy_browser.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest
from aiohttp import web

from agentlife._console._proxy import ProxyConfig, check_base_path, parse_allow_ips
from agentlife._console._server import ConsoleConfig, create_app
from agentlife._exceptions import ConfigError
from agentlife.stores import ApprovalRequest, store_from_url
from procs import cli_in_process

pytestmark = pytest.mark.anyio

TOKEN = "proxy-token-0123456789abcdef"
SECRET = "zq-proxy-secret-4c1d9e"
BASE = "/ops/agentlife"
PUBLIC = "https://public.example"


@dataclass
class Served:
    url: str
    http: httpx.AsyncClient
    db: Path
    data: Path


async def _fill(url: str) -> None:
    store = store_from_url(url)
    await store.open()
    try:
        await store.init_schema()
        await store.create_job("park-1", "deployer", {})
        await store.claim("park-1", 1)
        arguments = {"target": "prod", "note": f"use {SECRET}", "api_key": "plain-looking-value"}
        request = ApprovalRequest(
            "park-1/0/1", "d1", "deploy", 0, 1, arguments=arguments, said=f"Deploying now with {SECRET}."
        )
        await store.start_child("park-1", 1, "child-1", "helper", {}, invocation_id="park-1/0/0")
        await store.request_approval("park-1", 1, request)
        for i in range(3):
            await store.create_job(f"p-{i}", "alpha" if i else "beta", {})
        await store.create_job("park-old", "deployer", {})
        await store.claim("park-old", 1)
        await store.request_approval("park-old", 1, ApprovalRequest("park-old/0/1", "d0", "deploy", 0, 1))
        await store.create_job("done-1", "alpha", {})
        await store.claim("done-1", 1)
        await store.set_status("done-1", 1, "COMPLETED", result={})
        await store.create_job("stale-1", "alpha", {})
        await store.claim("stale-1", 1)
    finally:
        await store.close()


@asynccontextmanager
async def served(tmp_path: Path, proxy: ProxyConfig) -> AsyncIterator[Served]:
    db = tmp_path / "agentlife.db"
    url = f"sqlite:///{db}"
    if not db.exists():
        await _fill(url)
    data = tmp_path / "data"
    app = create_app(ConsoleConfig(url=url, token=TOKEN, data_dir=data, proxy=proxy))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        base = f"http://{host}:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            yield Served(base, http, db, data)
    finally:
        await runner.cleanup()


def _paths(html: str) -> list[str]:
    return re.findall(r'(?:href|src|action|data-live)="(/[^"]*)"', html)


async def test_every_page_link_form_asset_and_api_route_is_under_the_base_path(tmp_path: Path) -> None:
    async with served(tmp_path, ProxyConfig(BASE)) as s:
        pages = {}
        for path in ("/", "/job?id=park-1", "/overview", "/job?id=nope"):
            response = await s.http.get(BASE + path)
            pages[path] = response.text
            assert response.status_code == (404 if "nope" in path else 200), (path, response.text[:300])
            links = _paths(response.text)
            assert links and all(link.startswith(BASE + "/") for link in links), (path, links)
        assert 'action="/ops/agentlife/job/action"' in pages["/job?id=park-1"]
        assert 'data-live="/ops/agentlife/job/state?id=park-1"' in pages["/job?id=park-1"]
        css = await s.http.get(BASE + "/static/console.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        api = await s.http.get(BASE + "/api/v1/jobs/park-1")
        assert api.status_code == 200 and api.json()["status"] == "WAITING_FOR_APPROVAL"
        bare = await s.http.get(BASE)
        assert bare.status_code == 301 and bare.headers["location"] == BASE + "/"
        # Nothing is served outside the base path, and a 404 there is the console's page.
        for outside in ("/", "/job?id=park-1", "/api/v1/jobs/park-1", "/ops/agentlifeX/"):
            response = await s.http.get(outside)
            assert response.status_code == 404, outside
            assert "Content-Security-Policy" in response.headers
        # An action redirects under the base path.
        form = {"token": TOKEN, "action": "cancel", "id": "p-1"}
        done = await s.http.post(BASE + "/job/action", data=form)
        assert done.status_code == 303 and done.headers["location"].startswith(BASE + "/job?id=p-1&done=")


@pytest.mark.parametrize(
    "path",
    [
        "ops",
        "//evil.example/x",
        "/ops//x",
        "/ops/../x",
        "/ops/./x",
        "/ops/x?y=1",
        "/ops/x#y",
        "/ops/x\x00",
        "/ops/x\n",
        "/ops/%2e%2e",
        '/ops/"onload=x',
        "/ops/<b>",
        "/" + "a" * 300,
    ],
)
def test_a_forged_base_path_is_a_one_line_error_at_start(path: str) -> None:
    with pytest.raises(ConfigError) as raised:
        check_base_path(path)
    assert "\n" not in str(raised.value) and str(raised.value).startswith("--base-path")


def test_the_command_refuses_a_forged_base_path_and_bad_allowed_ips_before_listening() -> None:
    for args, needle in (
        (["--base-path", "/ops/../x"], "--base-path"),
        (["--forwarded-allow-ips", "10.0.0.0/33"], "--forwarded-allow-ips"),
        (["--forwarded-allow-ips", "proxy.example"], "--forwarded-allow-ips"),
    ):
        done = cli_in_process(
            "console", "--port", "0", *args, env={"AGENTLIFE_DATABASE_URL": "sqlite:///x.db"}
        )
        assert done.returncode != 0 and needle in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert check_base_path("/ops/agentlife/") == "/ops/agentlife" and check_base_path("/") == ""
    assert parse_allow_ips("*") == ((), True)


async def test_forwarded_headers_count_only_from_a_configured_peer(tmp_path: Path) -> None:
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "public.example", "Origin": PUBLIC}
    form = {"token": TOKEN, "action": "cancel", "id": "p-1"}
    # Not configured: a forged X-Forwarded-Host cannot make a cross-site POST look same-origin.
    async with served(tmp_path, ProxyConfig()) as s:
        refused = await s.http.post("/job/action", data=form, headers=forwarded)
        assert refused.status_code == 403 and "own pages" in refused.text
        evil = {**forwarded, "X-Forwarded-Host": "evil.example", "Origin": "https://evil.example"}
        assert (await s.http.post("/job/action", data=form, headers=evil)).status_code == 403
        api = await s.http.post(
            "/api/v1/jobs/p-1/cancel", json={}, headers={**forwarded, "Authorization": f"Bearer {TOKEN}"}
        )
        assert api.status_code == 403, api.text
    assert (await _status(tmp_path, "p-1")) == "PENDING"
    # Configured for another network: still ignored.
    allow, _ = parse_allow_ips("10.0.0.0/8, ::2")
    async with served(tmp_path, ProxyConfig(allow=allow)) as s:
        assert (await s.http.post("/job/action", data=form, headers=forwarded)).status_code == 403
    allow, _ = parse_allow_ips("127.0.0.1")
    async with served(tmp_path, ProxyConfig(allow=allow)) as s:
        # A trusted proxy's origin is the browser's; a cross-site one is still refused.
        for headers in (
            {**forwarded, "Origin": "https://evil.example"},
            {**forwarded, "Origin": "http://public.example"},
            {"Forwarded": 'for=1.2.3.4;proto=https;host="public.example"', "Origin": "https://evil.example"},
        ):
            assert (await s.http.post("/job/action", data=form, headers=headers)).status_code == 403, headers
        for bad in ({"X-Forwarded-Proto": "gopher"}, {"X-Forwarded-Host": "a b/c"}):
            response = await s.http.post("/job/action", data=form, headers={**forwarded, **bad})
            assert response.status_code == 400 and "forwarded" in response.text, bad
        assert (await _status(tmp_path, "p-1")) == "PENDING"
        done = await s.http.post("/job/action", data=form, headers=forwarded)
        assert done.status_code == 303, done.text
        rfc = {"Forwarded": 'for=1.2.3.4;proto=https;host="public.example"', "Origin": PUBLIC}
        api = await s.http.post(
            "/api/v1/jobs/p-2/cancel", json={}, headers={**rfc, "Authorization": f"Bearer {TOKEN}"}
        )
        assert api.status_code == 200, api.text
    assert (await _status(tmp_path, "p-1")) == "FAILED"


async def test_the_overview_counts_equal_what_job_list_says(tmp_path: Path) -> None:
    async with served(tmp_path, ProxyConfig()) as s:
        await _age_heartbeat(s.db, "stale-1")
        page = (await s.http.get("/overview")).text
    cells = re.findall(r'<td data-status="([A-Z_]+)" data-agent="([^"]*)">(?:<a [^>]*>)?(\d+)', page)
    assert cells
    env = {"AGENTLIFE_DATABASE_URL": f"sqlite:///{s.db}"}
    for status, agent, count in cells:
        args = ["job", "list", "--status", status, "--json", "--limit", "1000"]
        listed = cli_in_process(*args, *(["--agent", agent] if agent else []), env=env)
        assert listed.returncode == 0, listed.stderr
        assert len(listed.stdout.splitlines()) == int(count), (status, agent, count, listed.stdout)
    runnable = cli_in_process("job", "list", "--status", "PENDING", "--json", env=env).stdout.splitlines()
    assert re.search(rf'id="o-runnable">{len(runnable)}<', page)
    assert re.search(r'id="o-stale">1<', page) and "stale-1" in page
    assert "Completed: 1" in page


async def test_the_approval_shows_the_tool_arguments_and_the_model_text_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONSOLE_PROXY_TEST_TOKEN", SECRET)  # the console masks what its environment holds
    async with served(tmp_path, ProxyConfig()) as s:
        page = (await s.http.get("/job?id=park-1")).text
        child = (await s.http.get("/job?id=child-1")).text
    approval = page.split('id="h-approval"', 1)[1].split("</section>", 1)[0]
    assert "<code>deploy</code>" in approval and "&quot;target&quot;: &quot;prod&quot;" in approval
    assert "Deploying now with ***." in approval and "use ***" in approval
    assert "plain-looking-value" not in page and SECRET not in page
    assert 'href="/job?id=child-1"' in page and 'href="/job?id=park-1"' in child
    async with served(tmp_path, ProxyConfig()) as s:
        old = (await s.http.get("/job?id=park-old")).text
    assert "not recorded with this request" in old and "its digest is d0" in old


async def test_a_journal_downloads_masked_and_only_from_the_console_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONSOLE_PROXY_TEST_TOKEN", SECRET)
    async with served(tmp_path, ProxyConfig(BASE)) as s:
        sessions = s.data / "sessions" / "park-1"
        sessions.mkdir(parents=True)
        name = "session_0001_1700000000000.jsonl"
        lines = [
            {"v": 1, "ts": 1.0, "seq": 0, "type": "SESSION_STARTED", "note": f"token {SECRET}"},
            {"v": 1, "ts": 2.0, "seq": 1, "type": "TOOL_STARTED", "args": {"password": "hunter2-hunter2"}},
        ]
        (sessions / name).write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines) + b"not json\n")
        (sessions / "session_0002_1700000000001.jsonl").symlink_to("/etc/passwd")
        page = (await s.http.get(BASE + "/job?id=park-1")).text
        assert f'href="{BASE}/job/journal?id=park-1&amp;session={name}"' in page
        got = await s.http.get(BASE + "/job/journal", params={"id": "park-1", "session": name})
        assert got.status_code == 200 and "attachment" in got.headers["content-disposition"]
        shown = [orjson.loads(line) for line in got.text.splitlines()]
        assert shown[0]["note"] == "token ***" and shown[1]["args"]["password"] == "***"
        assert shown[2] == "not json" and SECRET not in got.text and "hunter2" not in got.text
        for session in ("session_0002_1700000000001.jsonl", "../../agentlife.db", "x", ""):
            bad = await s.http.get(BASE + "/job/journal", params={"id": "park-1", "session": session})
            assert bad.status_code in (400, 404) and "root:" not in bad.text, session
        other = (await s.http.get(BASE + "/job?id=p-0")).text
        assert "only from the disk this console reads" in other


async def _status(tmp_path: Path, job_id: str) -> str:
    store = store_from_url(f"sqlite:///{tmp_path / 'agentlife.db'}")
    await store.open()
    try:
        row = await store.get_job(job_id)
        assert row is not None
        return str(row.status)
    finally:
        await store.close()


async def _age_heartbeat(db: Path, job_id: str, age: float = 3600.0) -> None:
    import sqlite3

    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("UPDATE job SET heartbeat_at = ? WHERE id = ?", (time.time() - age, job_id))
    finally:
        conn.close()


async def test_a_journal_line_too_long_to_mask_whole_is_left_out_never_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentlife._console import _journals

    monkeypatch.setenv("CONSOLE_PROXY_TEST_TOKEN", SECRET)
    monkeypatch.setattr(_journals, "MAX_LINE", 1000)
    monkeypatch.setattr(_journals, "_CHUNK", 700)
    async with served(tmp_path, ProxyConfig()) as s:
        sessions = s.data / "sessions" / "park-1"
        sessions.mkdir(parents=True)
        name = "session_0001_1700000000000.jsonl"
        long_line = orjson.dumps({"type": "X", "pad": "p" * 1290 + SECRET + "q" * 1500})
        after = orjson.dumps({"type": "AFTER", "note": SECRET})
        (sessions / name).write_bytes(long_line + b"\n" + after + b"\n")
        got = await s.http.get("/job/journal", params={"id": "park-1", "session": name})
    shown = [orjson.loads(line) for line in got.text.splitlines()]
    assert [event["type"] for event in shown] == ["LINE_TOO_LONG", "AFTER"], got.text[:300]
    assert shown[1]["note"] == "***" and SECRET[:12] not in got.text


def test_the_arguments_an_approval_stores_are_json_whatever_the_tool_took() -> None:
    from agentlife._step._approvals import SHOWN_LIMIT, shown_arguments, shown_text

    class Thing:
        def __str__(self) -> str:
            return "a thing"

    deep: object = "x"
    for _ in range(10_000):
        deep = [deep]
    assert shown_arguments({"a": Thing(), "n": 1.5}) == {"a": "a thing", "n": 1.5}
    for odd in ({"s": "\udc80"}, {"n": 2**70}, {"deep": deep}):
        assert shown_arguments(odd) == "(the arguments cannot be shown: they are not JSON)"
    big = shown_arguments({"blob": "x" * 1_000_000, "password": "hunter2"})
    assert len(big["blob"]) < SHOWN_LIMIT + 100 and big["password"] == "***"
    assert shown_text("a\udc80b" + "y" * 10_000) == "a?b" + "y" * (SHOWN_LIMIT - 3)
    assert ApprovalRequest("j/0/1", "d", "t", arguments=shown_arguments({"deep": deep})).to_json(1.0)


def test_a_proxy_on_a_dual_stack_socket_is_trusted_by_its_ipv4_address() -> None:
    allow, _ = parse_allow_ips("127.0.0.1, 10.1.0.0/16")
    proxy = ProxyConfig(allow=allow)
    assert proxy.trusts("127.0.0.1") and proxy.trusts("::ffff:127.0.0.1") and proxy.trusts("10.1.2.3")
    for peer in (None, "", "127.0.0.2", "::1", "fe80::1%eth0", "not an address", "10.2.0.1"):
        assert not proxy.trusts(peer), peer
    assert not ProxyConfig().trusts("127.0.0.1") and ProxyConfig(allow_any=True).trusts(None)


async def test_the_overview_reads_rows_another_tool_wrote(tmp_path: Path) -> None:
    import sqlite3

    async with served(tmp_path, ProxyConfig()) as s:
        conn = sqlite3.connect(s.db, isolation_level=None)
        try:
            conn.execute(
                "UPDATE job SET heartbeat_at = 'soon', agent_id = ? WHERE id = 'stale-1'", (b"\xff<b>",)
            )
            conn.execute("UPDATE job SET updated_at = 'whenever', not_before = NULL WHERE id = 'p-0'")
            conn.execute("UPDATE job SET status = '<i>ODD</i>' WHERE id = 'p-2'")
        finally:
            conn.close()
        page = await s.http.get("/overview")
    assert page.status_code == 200, page.text[:500]
    assert (
        "&lt;i&gt;ODD&lt;/i&gt;" in page.text and "<i>ODD" not in page.text and "\ufffd&lt;b&gt;" in page.text
    )


async def test_a_journal_line_too_deep_to_parse_keeps_credential_keys_masked(tmp_path: Path) -> None:
    # orjson parses 1024 levels: a line nested deeper (written by someone else) comes as masked text, where
    # the values under credential-named keys are masked by the key's name as the parsed lines' are.
    depth = 1500
    inner = '{"private_key":"PRIVKEY-VALUE-1","credential":"CRED-VALUE-2","client_secret":"CS-VALUE-3"}'
    deep = '{"type":"X","x":' + '{"a":' * depth + inner + "}" * depth + "}"
    torn = '{"type":"Y","note":"ok","Private-Key":"TORN-VALUE-4","n":{"credential":{"k":"TORN-VALUE-5"'
    escaped = '{"type":"Z","private\\u005fkey":"ESCAPED-VALUE-6",'
    async with served(tmp_path, ProxyConfig()) as s:
        sessions = s.data / "sessions" / "park-1"
        sessions.mkdir(parents=True)
        name = "session_0001_1700000000000.jsonl"
        (sessions / name).write_text("\n".join([deep, torn, escaped]) + "\n")
        got = await s.http.get("/job/journal", params={"id": "park-1", "session": name})
    assert got.status_code == 200
    for value in ("PRIVKEY", "CRED-VALUE", "CS-VALUE", "TORN-VALUE", "ESCAPED-VALUE"):
        assert value not in got.text, value
    shown = [orjson.loads(line) for line in got.text.splitlines()]
    assert all(isinstance(line, str) for line in shown) and len(shown) == 3
    assert '"private_key":"***"' in shown[0] and '"note":"ok"' in shown[1]


async def test_a_journal_under_a_symlinked_job_directory_is_neither_offered_nor_served(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    name = "session_0001_1700000000000.jsonl"
    (outside / name).write_text('{"type":"X","note":"OUTSIDE-CONTENT"}\n')
    async with served(tmp_path, ProxyConfig()) as s:
        (s.data / "sessions").mkdir(parents=True)
        (s.data / "sessions" / "p-0").symlink_to(outside, target_is_directory=True)
        page = (await s.http.get("/job?id=p-0")).text
        got = await s.http.get("/job/journal", params={"id": "p-0", "session": name})
    assert "/job/journal" not in page and "OUTSIDE-CONTENT" not in page
    assert got.status_code == 404 and "OUTSIDE-CONTENT" not in got.text


async def test_the_overview_links_carry_no_secret_agent_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    monkeypatch.setenv("CONSOLE_PROXY_TEST_TOKEN", SECRET)
    async with served(tmp_path, ProxyConfig()) as s:
        conn = sqlite3.connect(s.db, isolation_level=None)
        try:
            conn.execute("UPDATE job SET agent_id = 'agent-postgres://u:hunter2pass@h/d' WHERE id = 'p-0'")
            conn.execute("UPDATE job SET agent_id = ? WHERE id = 'p-1'", (f"agent-{SECRET}",))
        finally:
            conn.close()
        page = (await s.http.get("/overview")).text
    assert "hunter2pass" not in page and SECRET not in page
    assert "agent-postgres://u:***@h/d" in page  # the cell still says which agent, masked


async def test_every_count_the_overview_links_is_a_list_that_answers(tmp_path: Path) -> None:
    import sqlite3

    async with served(tmp_path, ProxyConfig()) as s:
        conn = sqlite3.connect(s.db, isolation_level=None)
        try:  # statuses another client wrote: the list cannot filter by them
            conn.execute("UPDATE job SET status = 'BOGUS' WHERE id = 'p-0'")
            conn.execute("UPDATE job SET status = 'running' WHERE id = 'p-1'")
        finally:
            conn.close()
        page = (await s.http.get("/overview")).text
        links = [link.replace("&amp;", "&") for link in re.findall(r'href="(/\?[^"]*)"', page)]
        assert links and not any("BOGUS" in link or "=running" in link for link in links), links
        for link in links:
            assert (await s.http.get(link)).status_code == 200, link
    assert re.search(r'data-status="BOGUS" data-agent="beta">1<', page), page


async def test_the_overview_stale_limit_is_the_reapers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with served(tmp_path, ProxyConfig()) as s:
        await _age_heartbeat(s.db, "stale-1", 120.0)
        default = (await s.http.get("/overview")).text
    assert re.search(r'id="o-stale">0<', default) and "older than 300 s" in default
    monkeypatch.setenv("AGENTLIFE_HEARTBEAT_ZOMBIE_AFTER_SECONDS", "60")
    async with served(tmp_path, ProxyConfig()) as s:
        configured = (await s.http.get("/overview")).text
    assert re.search(r'id="o-stale">1<', configured) and "older than 60 s" in configured


async def test_an_action_with_two_origin_headers_is_refused(tmp_path: Path) -> None:
    async with served(tmp_path, ProxyConfig()) as s:
        own = s.url
        for origins in (["https://evil.example", own], [own, "https://evil.example"], [own, own]):
            headers = [("Origin", origin) for origin in origins]
            form = {"token": TOKEN, "action": "cancel", "id": "p-1"}
            page = await s.http.post("/job/action", data=form, headers=headers)
            assert page.status_code == 403, (origins, page.status_code)
            api = await s.http.post(
                "/api/v1/jobs/p-1/cancel", json={}, headers=[*headers, ("Authorization", f"Bearer {TOKEN}")]
            )
            assert api.status_code == 403, (origins, api.text)
        sites = [("Sec-Fetch-Site", "same-origin"), ("Sec-Fetch-Site", "same-origin")]
        assert (await s.http.post("/job/action", data=form, headers=sites)).status_code == 403
        one = await s.http.post("/job/action", data=form, headers={"Origin": own})
        assert one.status_code == 303
