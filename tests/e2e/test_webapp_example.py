"""examples/webapp in a real headless Chromium, against a real console (its HTTP API) and one real worker.

A person starts a job from the form; the job page follows it through the API's event stream with the
browser's ``EventSource`` (relayed by the app) before the worker runs it, shows the published progress and
the model's text growing delta by delta as it streams, then the job's question; the answer typed into the
box reaches the job's ``wait_for_event`` through the API's ``send``, and the page shows the result. In the
same browser, a script on the console's own page reads the API's event stream directly with an
``EventSource``: every durable event of the job once, in order, then its end; and again from a cursor.
One browser session, one worker. Chromium missing is a failure, not a skip.
"""

from __future__ import annotations

import runpy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from consoles import TOKEN, chromium, start_console, stop
from procs import REPO, agent_env
from world import init_schema

WEBAPP = REPO / "examples" / "webapp"
DRAFT = runpy.run_path(str(WEBAPP / "webapp_agent.py"))["DRAFT"]


#: The job's published events and its end, in order (its status changes come between them).
EVENTS = [
    ("published", "progress"),
    ("published", "progress"),
    ("published", "progress"),
    ("published", "question"),
    ("published", "progress"),
    ("end", "COMPLETED"),
]


def _published(events: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [event for event in events if event[0] in ("published", "end")]


def _start_webapp(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [sys.executable, "app.py", "--port", "0"],
        cwd=WEBAPP,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if "http://" not in line:
        proc.kill()
        raise AssertionError(f"the web app did not start: {line!r} {proc.communicate()[1].decode()}")
    return proc, "http://" + line.split("http://", 1)[1].split()[0]


def _wait(driver: Any, script: str, timeout: float = 60) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: d.execute_script(script))


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[dict[str, str], str, str]]:
    env = agent_env(
        tmp_path / "data",
        AGENTLIFE_DATABASE_URL=f"sqlite:///{tmp_path / 'agentlife.db'}",
        AGENTLIFE_CONSOLE_TOKEN=TOKEN,
        WEBAPP_CHUNKS="12",
        WEBAPP_CHUNK_DELAY="0.05",
    )
    init_schema(env["AGENTLIFE_DATABASE_URL"])  # what `db init` does, without a process for it
    console, console_url = start_console(env, "--allow-actions")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        webapp, webapp_url = _start_webapp({**env, "AGENTLIFE_API_URL": console_url.rstrip("/")})
        procs.append(webapp)
        yield env, console_url, webapp_url
    finally:
        for proc in procs:
            proc.terminate()
            proc.communicate(timeout=30)
        stop(console)


def test_a_person_starts_follows_answers_and_reads_a_job_in_the_browser(
    stack: tuple[dict[str, str], str, str],
) -> None:
    from selenium.webdriver.common.by import By

    env, console_url, webapp_url = stack
    worker: subprocess.Popen[bytes] | None = None
    with chromium() as driver:
        try:
            driver.get(webapp_url)
            driver.find_element(By.NAME, "topic").clear()
            driver.find_element(By.NAME, "topic").send_keys("tides <b>and</b> the moon")
            driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
            _wait(driver, "return document.getElementById('status') !== null")
            job_id = driver.current_url.rsplit("/", 1)[1]
            # the page follows the job before any worker runs it: it sees every delta of the reply
            _wait(driver, "return document.getElementById('status').textContent === 'following'")
            worker = subprocess.Popen(
                [sys.executable, "-m", "agentlife", "worker", "webapp_agent:Researcher"],
                cwd=WEBAPP,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            _wait(driver, "return !document.getElementById('ask').hidden")
            seen = driver.execute_script("return window.webapp")
            assert seen["events"][:5] == ["status:RUNNING"] + [f"{k}:{n}" for k, n in EVENTS[:4]], seen
            assert driver.find_element(By.ID, "phase").text == "waiting for you"
            assert "Who is the draft for" in driver.find_element(By.ID, "question").text

            driver.find_element(By.ID, "answer").send_keys("a <i>class</i>")
            driver.find_element(By.CSS_SELECTOR, "#ask button").click()
            _wait(driver, "return document.getElementById('result').textContent.includes('audience')")
            result = driver.find_element(By.ID, "result").text
            assert (
                '"audience": "a <i>class</i>"' in result and '"topic": "tides <b>and</b> the moon"' in result
            )
            assert driver.find_element(By.ID, "status").text == "COMPLETED"
            # the model's text came as it was written: delta by delta, each adding to the one before
            lengths = driver.execute_script("return window.webapp.lengths")
            assert len(lengths) >= 3 and lengths == sorted(set(lengths)), lengths
            assert driver.find_element(By.ID, "draft").text == DRAFT, lengths
            on_page = [tuple(e.split(":")) for e in driver.execute_script("return window.webapp.events")]
            assert _published(on_page) == EVENTS, on_page
            assert on_page.index(("status", "WAITING")) == on_page.index(("published", "question")) + 1
            assert driver.execute_script("return document.querySelector('i, b') === null")  # text, not HTML

            # The API's stream read by the browser itself, on the console's own page (same origin).
            driver.get(console_url)
            read = """
                const [path, done] = [arguments[0], arguments[arguments.length - 1]];
                const got = [];
                const source = new EventSource(path);
                for (const kind of ["status", "published", "delta", "end"]) {
                  source.addEventListener(kind, (e) => {
                    got.push([kind, e.lastEventId, JSON.parse(e.data).name]);
                    if (kind === "end") { source.close(); done(got); }
                  });
                }
            """
            stream = f"/api/v1/jobs/{job_id}/events"
            everything = driver.execute_async_script(read, stream)
            kinds = [(kind, name) for kind, _, name in everything]
            assert kinds == on_page  # the durable events: the relay changed nothing; no delta is kept
            seqs = [int(cursor.split(".")[0]) for _, cursor, _ in everything]
            assert seqs == sorted(set(seqs))  # each durable event once, in order
            question = next(cursor for kind, cursor, name in everything if name == "question")
            after = driver.execute_async_script(read, f"{stream}?after={question}")
            assert [(k, n) for k, _, n in after] == kinds[kinds.index(("published", "question")) + 1 :]
            # The app's own answer route, sent what no page sends: a clean 400, never a 500.
            answer = f"{webapp_url.rstrip('/')}/jobs/{job_id}/answer"
            for body in (b"{torn", b'{"text": 5}', b"\xff"):
                refused = httpx.post(answer, content=body, headers={"Content-Type": "application/json"})
                assert refused.status_code == 400 and refused.json()["error"], refused.text
        finally:
            if worker is not None:
                worker.terminate()
                _, err = worker.communicate(timeout=30)
                assert b"Traceback" not in err, err.decode(errors="replace")[-2000:]
