"""The console for an on-call shift in a real headless Chromium, behind a real reverse proxy that
terminates TLS and serves it under a sub-path (tests/revproxy.py, an aiohttp proxy setting
X-Forwarded-Proto/-Host/-For and X-Forwarded-User), over a store a real ``python -m agentlife run`` parked
on an approval. One browser session drives every check (Chromium is expensive): the overview's counts
equal ``job list``'s; the list refreshes its rows by itself while a filter is being typed; the approval
shows the tool, its arguments and the model's text, masked (and the row holds them masked); approving from
the page goes through the proxy and the job completes; the journal downloads masked and the job's event
stream works under the base path; pause and resume from the page, each recorded with the actor the
proxy's X-Forwarded-User names (``--actor-header``); a console that does not trust the proxy refuses the
same action. The screenshots of docs/console.md's on-call part are taken here (written with
``CONSOLE_SCREENSHOTS=1``). Chromium missing is a failure, not a skip."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from consoles import TOKEN, chromium, start_console, stop
from procs import REPO, TESTS, agent_env, cli_in_process, spawn

SECRET = "zq-ops-secret-93be1f7d"
BASE = "/ops/agentlife"
DOCS = REPO / "docs"


def _proxy(upstream: str, cert: Path, key: Path) -> tuple[subprocess.Popen[bytes], str]:
    origin = upstream.rstrip("/").removesuffix(BASE)
    command = [sys.executable, str(TESTS / "revproxy.py"), "--upstream", origin, "--prefix", BASE]
    tls = ["--cert", str(cert), "--key", str(key), "--user", "alice@example"]
    proc = subprocess.Popen([*command, *tls], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("proxy at https://"):
        proc.kill()
        raise AssertionError(f"the proxy did not start: {line!r} {proc.stderr.read()!r}")
    return proc, line.split()[-1]


def _certificate(root: Path) -> tuple[Path, Path]:
    cert, key = root / "cert.pem", root / "key.pem"
    subject = ["-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)]
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", *subject],
        check=True,
        capture_output=True,
    )
    return cert, key


def _wait_status(env: dict[str, str], job_id: str, status: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        shown = cli_in_process("job", "show", job_id, "--events", "0", env=env)
        if f"status      {status}" in shown.stdout:
            return
        assert time.monotonic() < deadline, shown.stdout + shown.stderr
        time.sleep(0.1)


def _wait(driver: Any, until: Any, timeout: float = 30) -> Any:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, timeout, ignored_exceptions=ignored).until(until)


def _text(driver: Any, css: str) -> str:
    script = "const e = document.querySelector(arguments[0]); return e === null ? null : e.innerText"
    return str(_wait(driver, lambda d: d.execute_script(script, css)))


def _shot(driver: Any, name: str) -> None:
    png: bytes = driver.get_screenshot_as_png()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000, len(png)
    if os.environ.get("CONSOLE_SCREENSHOTS") == "1":
        (DOCS / name).write_bytes(png)


def test_the_console_behind_a_tls_proxy_on_a_sub_path(tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    db = tmp_path / "agentlife.db"
    env = agent_env(
        tmp_path / "data",
        AGENTLIFE_DATABASE_URL=f"sqlite:///{db}",
        APPROVAL_DIR=str(tmp_path),
        AGENTLIFE_APPROVAL_POLL_SECONDS="0.05",
        OPS_DEPLOY_TOKEN=SECRET,
    )
    assert cli_in_process("db", "init", env=env).returncode == 0
    for job_id, agent in (
        ("ops-1", "ops-deployer"),
        ("q-1", "mailer"),
        ("q-2", "mailer"),
        ("q-3", "billing"),
    ):
        assert cli_in_process("job", "create", agent, "--id", job_id, env=env).returncode == 0
    worker = spawn("agents.console_ops_agents:ExplainingDeployer", env, "--job-id", "ops-1")
    procs: list[subprocess.Popen[bytes]] = [worker]
    try:
        cert, key = _certificate(tmp_path)
        console_env = {**env, "AGENTLIFE_CONSOLE_TOKEN": TOKEN}
        flags = ("--allow-actions", "--base-path", BASE)
        trusted = ("--forwarded-allow-ips", "127.0.0.1", "--actor-header", "X-Forwarded-User")
        trusting, trusting_url = start_console(console_env, *flags, *trusted)
        wary, wary_url = start_console(console_env, *flags)
        procs += [trusting, wary]
        assert trusting_url.endswith(BASE + "/") and wary_url.endswith(BASE + "/")
        proxy, url = _proxy(trusting_url, cert, key)
        wary_proxy, wary_url = _proxy(wary_url, cert, key)
        procs += [proxy, wary_proxy]
        _wait_status(env, "ops-1", "WAITING_FOR_APPROVAL")
        with chromium("--ignore-certificate-errors") as d:
            _overview_matches_job_list(d, url, env)
            _list_refreshes_while_typing(d, url, env)
            _approval_shows_arguments_and_goes_through_the_proxy(d, url, env, db)
            assert worker.wait(timeout=60) == 0
            _wait_status(env, "ops-1", "COMPLETED")
            shown = cli_in_process("job", "show", "ops-1", env=env).stdout
            assert "by alice@example" in shown, shown  # the actor the proxy named, recorded with the grant
            _pause_and_resume_from_the_page(d, url, env)
            _journal_and_events_under_the_base_path(d, url)
            # The same action through the same kind of proxy, to a console that does not trust it.
            d.get(wary_url + "job?id=q-3")
            d.find_element(By.ID, "cancel-token").send_keys(TOKEN)
            d.find_element(By.CSS_SELECTOR, "button[value=cancel]").click()
            _wait(d, lambda drv: drv.current_url.endswith(BASE + "/job/action"))
            assert _text(d, "h1") == "403 Forbidden" and "own pages" in _text(d, "main")
            _wait_status(env, "q-3", "PENDING", timeout=5)
    finally:
        for proc in procs:
            if proc is worker:
                if proc.poll() is None:
                    proc.kill()
                proc.communicate()
            elif proc in procs[1:3]:
                stop(proc)
            else:
                proc.kill()
                proc.communicate()


def _overview_matches_job_list(d: Any, url: str, env: dict[str, str]) -> None:
    d.get(url + "overview")
    assert d.current_url.startswith("https://") and _text(d, "h1") == "Overview"
    cells = d.execute_script(
        "return Array.from(document.querySelectorAll('table.overview td[data-status]'))"
        ".map(td => [td.dataset.status, td.dataset.agent, td.innerText.trim()])"
    )
    assert cells
    for status, agent, count in cells:
        args = ["job", "list", "--status", status, "--json", "--limit", "1000"]
        listed = cli_in_process(*args, *(["--agent", agent] if agent else []), env=env)
        assert len(listed.stdout.splitlines()) == int(count), (status, agent, count)
    assert _text(d, "#o-runnable") == "3"  # q-1, q-2, q-3: ops-1 is parked
    script = "return Array.from(document.querySelectorAll('a, link, script')).map(e => e.getAttribute('href') || e.getAttribute('src'))"  # noqa: E501
    links = [link for link in d.execute_script(script) if link and not link.startswith("#")]
    assert links and all(link.startswith(BASE + "/") for link in links), links
    _shot(d, "console-overview.png")


def _list_refreshes_while_typing(d: Any, url: str, env: dict[str, str]) -> None:
    from selenium.webdriver.common.by import By

    d.get(url)
    box = d.find_element(By.ID, "f-agent")
    box.send_keys("mail")  # being typed, not submitted
    assert cli_in_process("job", "create", "mailer", "--id", "q-new", env=env).returncode == 0
    _wait(d, lambda drv: "q-new" in drv.find_element(By.CSS_SELECTOR, "table.jobs").text, timeout=30)
    assert d.find_element(By.ID, "f-agent").get_attribute("value") == "mail"
    assert d.execute_script("return performance.getEntriesByType('navigation').length") == 1


def _approval_shows_arguments_and_goes_through_the_proxy(
    d: Any, url: str, env: dict[str, str], db: Path
) -> None:
    from selenium.webdriver.common.by import By

    d.get(url + "job?id=ops-1")
    approval = _text(d, "section.approval")
    assert "deploy" in approval and "prod?key=***" in approval, approval
    assert "The build is green; deploying to prod with token ***." in approval, approval
    assert SECRET not in d.page_source
    conn = sqlite3.connect(db)
    try:
        (stored,) = conn.execute("SELECT approval FROM job WHERE id = 'ops-1'").fetchone()
    finally:
        conn.close()
    assert "prod?key=***" in stored and SECRET not in stored  # masked by the worker, in the row too
    _shot(d, "console-approval-arguments.png")
    d.find_element(By.ID, "approve-token").send_keys(TOKEN)
    d.find_element(By.CSS_SELECTOR, "button[value=approve]").click()
    _wait(d, lambda drv: "done=approve." in drv.current_url)
    assert d.current_url.startswith(url + "job?id=ops-1&done=")
    assert "Approved" in _text(d, ".flash")


def _pause_and_resume_from_the_page(d: Any, url: str, env: dict[str, str]) -> None:
    from selenium.webdriver.common.by import By

    for action, status in (("pause", "PAUSED"), ("resume", "PENDING")):
        d.get(url + "job?id=q-1")
        d.find_element(By.ID, f"{action}-token").send_keys(TOKEN)
        d.find_element(By.CSS_SELECTOR, f"button[value={action}]").click()
        _wait(d, lambda drv, a=action: f"done={a}." in drv.current_url)
        _wait_status(env, "q-1", status, timeout=5)
    history = cli_in_process("job", "show", "q-1", env=env).stdout
    assert history.count("by alice@example") >= 2, history  # the pause and the resume, each by its actor


def _journal_and_events_under_the_base_path(d: Any, url: str) -> None:
    d.get(url + "job?id=ops-1")
    link = _wait(
        d,
        lambda drv: drv.execute_script(
            "const a = document.querySelector('ul.journals a'); return a && a.href"
        ),
    )
    assert link.startswith(url + "job/journal?id=ops-1&session=session_")
    journal = d.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0]).then(r => r.text()).then(done, e => done('error ' + e));",
        link,
    )
    assert "APPROVAL_REQUESTED" in journal and SECRET not in journal and "***" in journal
    first = d.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        f"const s = new EventSource('{BASE}/api/v1/jobs/ops-1/events');"
        "const got = e => { s.close(); done(e.data); };"
        "for (const kind of ['message', 'status', 'published', 'end']) { s.addEventListener(kind, got); }"
        "s.onerror = () => { s.close(); done('error'); };",
    )
    assert first != "error" and "ops-1" in first and SECRET not in first, first
    assert re.search(r"COMPLETED", _text(d, "dl.summary"))
