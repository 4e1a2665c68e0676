"""The console in a real headless Chromium, over a store filled by real ``python -m agentlife run``
processes: a completed tool-using job, a crashed one, a drained one (SIGTERM) and one parked for approval.
The pages are read as a user reads them: the list's filters, a job's steps and calls in order, the
conversation with its secrets masked, hostile ids and payloads as text, and an approval made from the page
that resumes the parked process, whose page then follows it to COMPLETED by itself. The screenshots in the
docs are taken here. Chromium missing is a failure, not a skip."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest

from consoles import TOKEN, chromium, insert_row, start_console, stop
from procs import REPO, agent_env, cli_in_process, spawn, wait_for

SECRET = "zq-console-secret-7f3a9c1e"
HOSTILE_ID = "<script>document.title='pwned';window.pwned=1</script>"
LONG_AGENT = "agent-" + "x" * 3000
CRASH = f"pwd={SECRET}-crash failed"
DOCS = REPO / "docs"


@dataclass
class World:
    url: str
    env: dict[str, str]
    parked: subprocess.Popen[bytes]
    db: Path


def _wait_status(env: dict[str, str], job_id: str, status: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        shown = cli_in_process("job", "show", job_id, "--events", "0", env=env)
        if f"status      {status}" in shown.stdout:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(shown.stdout + shown.stderr)
        time.sleep(0.1)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("console")
    db = root / "agentlife.db"
    traces = root / "traces"
    traces.mkdir()
    env = agent_env(
        root / "data",
        AGENTLIFE_DATABASE_URL=f"sqlite:///{db}",
        APPROVAL_DIR=str(traces),
        TEST_MARKER_DIR=str(traces),
        AGENTLIFE_APPROVAL_POLL_SECONDS="0.05",
        CONSOLE_TEST_VALUE=SECRET,
    )
    assert cli_in_process("db", "init", env=env).returncode == 0
    payload = '{"prompt": "find <b>it</b>", "password": "pw-in-the-payload"}'
    for job_id, agent, body in (
        ("chat-1", "chatty", payload),
        ("crash-1", "crash-agent", "{}"),
        ("drain-1", "drain-agent", "{}"),
        ("park-1", "deployer", "{}"),
    ):
        assert (
            cli_in_process("job", "create", agent, "--id", job_id, "--payload", body, env=env).returncode == 0
        )
    procs = {
        "chat-1": spawn("agents.console_agents:Chatty", env, "--job-id", "chat-1"),
        "crash-1": spawn("agents.drain_agent:CrashAgent", env, "--job-id", "crash-1"),
        "drain-1": spawn(
            "agents.drain_agent:DrainAgent",
            {**env, "TEST_STEPS": "200", "TEST_STEP_SECONDS": "0.2"},
            "--job-id",
            "drain-1",
        ),
        "park-1": spawn("agents.approval_agent:Deployer", env, "--job-id", "park-1"),
    }
    try:
        wait_for(traces / "step-1-done", timeout=60)
        procs["drain-1"].send_signal(signal.SIGTERM)
        codes = {name: procs[name].wait(timeout=60) for name in ("chat-1", "crash-1", "drain-1")}
        assert codes["chat-1"] == 0 and codes["crash-1"] != 0 and codes["drain-1"] == 143, codes
        _wait_status(env, "park-1", "WAITING_FOR_APPROVAL")
        insert_row(
            db, HOSTILE_ID, "<img src=x onerror=window.pwned=1>", {"x": "<script>window.pwned=1</script>"}
        )
        insert_row(db, "big-1", "chatty", {"blob": "<svg onload=window.pwned=1>" * 40_000})
        insert_row(db, "long-agent-1", LONG_AGENT, {})
        crash = [{"at": time.time() - 5, "attempt": 1, "error_class": "RuntimeError", "message": CRASH}]
        insert_row(db, "sec-1", "demo", {}, error=orjson.dumps(crash).decode())
        cancelled = cli_in_process(
            "job", "cancel", "sec-1", "--reason", f"passphrase: {SECRET}-cancel", "--actor", "sre", env=env
        )
        assert cancelled.returncode == 0
        console_env = {**env, "AGENTLIFE_CONSOLE_TOKEN": TOKEN, "CONSOLE_TEST_SECRET": SECRET}
        console, url = start_console(console_env, "--allow-actions")
        try:
            yield World(url, env, procs["park-1"], db)
        finally:
            stop(console)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with chromium() as driver:
        yield driver


def _not_pwned(driver: object) -> None:
    assert driver.execute_script("return window.pwned === undefined")  # type: ignore[attr-defined]
    assert driver.title != "pwned"  # type: ignore[attr-defined]


def _shot(driver: object, name: str) -> None:
    """Screenshot the page for the docs: written into docs/ with ``CONSOLE_SCREENSHOTS=1``, else only
    taken (a test run must not rewrite the source tree) and checked to be a picture."""
    png: bytes = driver.get_screenshot_as_png()  # type: ignore[attr-defined]
    assert png.startswith(b"\x89PNG") and len(png) > 10_000, len(png)
    if os.environ.get("CONSOLE_SCREENSHOTS") == "1":
        (DOCS / name).write_bytes(png)


def _rows(driver: object) -> list[str]:
    # One script, one snapshot: element handles read one by one go stale while a submitted page loads
    # ("Node with given id does not belong to the document").
    script = (
        "return Array.from(document.querySelectorAll('table.jobs tbody td:first-child a'))"
        ".map(a => a.textContent.trim())"
    )
    return list(driver.execute_script(script))  # type: ignore[attr-defined]


def _wait(driver: object, until: Any, timeout: float = 30) -> Any:
    """Wait until ``until(driver)`` is truthy: a page still loading after a submit, or its polling
    replacing the content, leaves elements found a moment before stale; look again."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, timeout, ignored_exceptions=ignored).until(until)


def _text(driver: object, css: str) -> str:
    """The rendered text of the first ``css`` element, read in one script once it is there: a page still
    loading, or re-rendered by its polling, leaves element handles stale between finding and reading."""
    script = "const e = document.querySelector(arguments[0]); return e === null ? null : e.innerText"
    return str(_wait(driver, lambda d: d.execute_script(script, css)))


def _rows_become(driver: object, expected: list[str]) -> None:
    _wait(driver, lambda d: _rows(d) == expected)
    assert _rows(driver) == expected


def test_the_list_filters_by_status_and_agent_and_finds_a_job_by_id(world: World, browser: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    d: object = browser
    d.get(world.url)  # type: ignore[attr-defined]
    assert {"chat-1", "crash-1", "drain-1", "park-1", HOSTILE_ID} <= set(_rows(d))
    _not_pwned(d)
    _shot(d, "console-jobs.png")
    Select(d.find_element(By.ID, "f-status")).select_by_value("COMPLETED")  # type: ignore[attr-defined]
    d.find_element(By.CSS_SELECTOR, "form.filters button").click()  # type: ignore[attr-defined]
    _rows_become(d, ["chat-1"])
    d.get(world.url + "?agent=deployer")  # type: ignore[attr-defined]
    _rows_become(d, ["park-1"])
    d.get(world.url)  # type: ignore[attr-defined]
    box = d.find_element(By.ID, "f-id")  # type: ignore[attr-defined]
    box.send_keys("crash-1")
    box.submit()
    _rows_become(d, ["crash-1"])


def test_a_job_page_shows_its_steps_and_calls_in_order_with_secrets_masked(
    world: World, browser: object
) -> None:
    from selenium.webdriver.common.by import By

    d: object = browser
    d.get(world.url + "job?id=chat-1")  # type: ignore[attr-defined]
    items = [li.text for li in d.find_elements(By.CSS_SELECTOR, ".timeline-list li")]  # type: ignore[attr-defined]
    order = [
        next(i for i, text in enumerate(items) if needle in text)
        for needle in ("attempt 1 started", "step 0 (checkpointed)", "model call", "tool lookup", "step 1")
    ]
    assert order == sorted(order), items
    assert any("exit code 0" in text for text in items)
    assert d.find_elements(By.CSS_SELECTOR, "svg.timeline rect.bar.tool")  # type: ignore[attr-defined]
    bubbles = d.find_elements(By.CSS_SELECTOR, ".chat .bubble")  # type: ignore[attr-defined]
    roles = [b.find_element(By.CSS_SELECTOR, ".role").text.lower() for b in bubbles]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert "Calls tool lookup" in bubbles[1].text and "<script>window.pwned=1</script>" in bubbles[1].text
    assert "All done <img src=x onerror=window.pwned=1>" in bubbles[3].text
    source = d.page_source  # type: ignore[attr-defined]
    assert SECRET not in source and "pw-in-the-payload" not in source and "***" in source
    _not_pwned(d)
    _shot(d, "console-job.png")


def test_crashed_and_drained_jobs_show_their_history(world: World, browser: object) -> None:

    d: object = browser
    d.get(world.url + "job?id=crash-1")  # type: ignore[attr-defined]
    text = _text(d, "main")
    assert "RuntimeError: boom in step 1" in text and "Crash history (1)" in text
    d.get(world.url + "job?id=drain-1")  # type: ignore[attr-defined]
    text = _text(d, "main")
    assert "drain:" in text and "exit code 143" in text
    assert "draining (execution)" in text and "hydrating (bootstrap)" in text


def test_hostile_ids_and_payloads_are_text_and_never_run(world: World, browser: object) -> None:

    d: object = browser
    d.get(world.url + "job?id=" + quote(HOSTILE_ID, safe=""))  # type: ignore[attr-defined]
    assert _text(d, "h1 .id") == HOSTILE_ID  # type: ignore[attr-defined]
    _not_pwned(d)
    d.get(world.url + "job?id=big-1")  # type: ignore[attr-defined]
    _not_pwned(d)
    assert len(d.page_source) < 400_000  # type: ignore[attr-defined]
    d.get(world.url + "job?id=no-such-job")  # type: ignore[attr-defined]
    assert _text(d, "h1") == "404 Not Found"  # type: ignore[attr-defined]


def test_a_long_agent_id_is_cut_in_the_list_and_leaves_every_column_readable(
    world: World, browser: object
) -> None:
    d: object = browser
    d.get(world.url)  # type: ignore[attr-defined]
    script = """
        const rows = Array.from(document.querySelectorAll('table.jobs tbody tr'));
        return rows.map(r => ({
            id: r.cells[0].innerText,
            agent: r.cells[1].innerText,
            title: (r.cells[1].querySelector('[title]') || {title: null}).title,
            statusLines: r.cells[2].querySelector('.status').getClientRects().length,
            statusWidth: r.cells[2].getBoundingClientRect().width,
            tableWidth: r.closest('table').getBoundingClientRect().width,
        }));
    """
    rows = d.execute_script(script)  # type: ignore[attr-defined]
    row = next(r for r in rows if r["id"] == "long-agent-1")
    assert len(row["agent"]) <= 64 and row["agent"].endswith("…")
    assert row["title"] == LONG_AGENT
    # Every status reads on one line in a column wider than a letter, on every row.
    assert all(r["statusLines"] == 1 and r["statusWidth"] > 60 for r in rows), rows
    assert row["tableWidth"] <= 1280


def test_a_timeline_drawn_from_the_crash_history_masks_what_it_shows(world: World, browser: object) -> None:
    d: object = browser
    d.get(world.url + "job?id=sec-1")  # type: ignore[attr-defined]
    titles = d.execute_script(  # type: ignore[attr-defined]
        "return Array.from(document.querySelectorAll('svg.timeline polygon.mark title'))"
        ".map(t => t.textContent)"
    )
    assert titles == ["RuntimeError: pwd=*** failed", "Cancelled by sre: passphrase: ***"], titles
    assert SECRET not in d.page_source  # type: ignore[attr-defined]
    assert "pwd=*** failed" in _text(d, ".timeline-list")


def test_approve_from_the_page_resumes_the_parked_job_and_the_page_follows_it(
    world: World, browser: object
) -> None:
    from selenium.webdriver.common.by import By

    d: object = browser
    page = world.url + "job?id=park-1"
    d.get(page + "&done=approve")  # type: ignore[attr-defined]  # a crafted link: nothing was approved
    assert "deploy (park-1/0/1" in _text(d, "ul.waits")
    assert not d.find_elements(By.CSS_SELECTOR, ".flash")  # type: ignore[attr-defined]
    # Parked on the approval and alive: its open session is drawn as such, not as a crash.
    assert not d.find_elements(By.CSS_SELECTOR, "svg.timeline polygon.mark.crash")  # type: ignore[attr-defined]
    assert d.find_elements(By.CSS_SELECTOR, "svg.timeline polygon.mark.live")  # type: ignore[attr-defined]
    assert "parked on an approval, alive" in _text(d, ".timeline-list")
    d.get(page)  # type: ignore[attr-defined]
    _shot(d, "console-approval.png")
    d.find_element(By.ID, "approve-token").send_keys("not-the-token-at-all")  # type: ignore[attr-defined]
    d.find_element(By.CSS_SELECTOR, "button[value=approve]").click()  # type: ignore[attr-defined]
    _wait(d, timeout=30, until=lambda drv: drv.current_url.endswith("/job/action"))  # type: ignore[attr-defined]
    assert _text(d, "h1") == "403 Forbidden"  # type: ignore[attr-defined]
    _wait_status(world.env, "park-1", "WAITING_FOR_APPROVAL", timeout=5)
    d.get(page)  # type: ignore[attr-defined]
    d.find_element(By.ID, "approve-token").send_keys(TOKEN)  # type: ignore[attr-defined]
    d.find_element(By.CSS_SELECTOR, "button[value=approve]").click()  # type: ignore[attr-defined]
    _wait(d, timeout=30, until=lambda drv: "done=approve." in drv.current_url)  # type: ignore[attr-defined]
    assert "Approved" in _text(d, ".flash") and "The store recorded it" in _text(d, ".flash")
    assert TOKEN not in d.page_source  # type: ignore[attr-defined]
    assert world.parked.wait(timeout=60) == 0
    # No reload: the page's own polling sees the job finish.
    _wait(
        d,
        timeout=30,
        until=lambda drv: "COMPLETED" in drv.find_element(By.CSS_SELECTOR, "dl.summary").text,  # type: ignore[attr-defined]
    )
    _not_pwned(d)
