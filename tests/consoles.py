"""Helpers for the console tests: a real ``python -m agentlife console`` process and rows written by hand."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from procs import REPO

TOKEN = "console-token-0123456789abcdef"


def start_console(env: Mapping[str, str], *args: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start the console on a free port: (the process, its base URL ending in ``/``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentlife", "console", "--port", "0", *args],
        env=dict(env),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if "http://" not in line:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the console did not start: {line!r} {err.decode(errors='replace')}")
    return proc, "http://" + line.split("http://", 1)[1].split()[0]


def stop(proc: subprocess.Popen[bytes]) -> str:
    """SIGTERM the console; its stderr."""
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    return err.decode(errors="replace")


def request(
    url: str, data: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None
) -> tuple[int, str, dict[str, str]]:
    """GET (or POST a form when ``data`` is given) without following redirects: (status, body, headers)."""
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, headers=dict(headers or {}))

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=30) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace"), dict(exc.headers)


def insert_row(
    db: Path, job_id: object, agent_id: str, payload: object, status: str = "PENDING", **columns: object
) -> None:
    """A job row written straight into the SQLite table, as another tool would (no id validation).

    ``columns`` sets more columns as given (JSON ones as text): ``error``, ``result``, ``updated_at`` ...
    """
    values = {
        "id": job_id,
        "agent_id": agent_id,
        "status": status,
        "payload": orjson.dumps(payload).decode(),
        "attempt": 0,
        "updated_at": time.time(),
        **columns,
    }
    names = ", ".join(values)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute(
            f"INSERT INTO job ({names}) VALUES ({', '.join('?' * len(values))})", tuple(values.values())
        )
    finally:
        conn.close()


CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


@contextlib.contextmanager
def chromium(*flags: str) -> Iterator[Any]:
    """A headless Chromium driven by selenium; a failure (never a skip) when it is not installed.

    ``flags``: more command-line flags (``--ignore-certificate-errors`` for a proxy's own certificate).
    """
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        raise AssertionError(
            "Chromium is missing: apt-get install chromium chromium-driver (the browser tests need it)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="agentlife-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-quic",
        "--window-size=1280,1000",
        f"--user-data-dir={profile}",
        *flags,
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
