"""No secret a row can hold reaches a console page, a timeline drawn from the crash history, or a JSON answer.

A real console process reads a SQLite store whose rows were written as another client would (by hand) and
by the real ``job cancel`` command, with a secret in every field a row holds: the agent id, the payload
(under keys named ``pwd``, ``passphrase``, ``auth``, ``cookie`` and inside JSON text), the result, the
crash history (messages, classes, a message that is an object), an operator's cancel reason, the checkpoint
id, the spend, and the call an approval waits for. The console runs as in its own pod: it cannot read the
jobs' journals, so the timeline is drawn from the row's crash history, the path that once showed them in
clear in the SVG's titles.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import orjson

from agentlife.stores import ApprovalRequest, store_from_url
from consoles import insert_row, request, start_console, stop
from procs import agent_env, cli_in_process

ENV_SECRET = "env-secret-value-0417"
#: Every secret planted, by where it is planted; none may reach a page.
SECRETS = {
    name: f"{name}-{n:02d}-zq"
    for n, name in enumerate(
        [
            "agent-tok",
            "payload-pwd",
            "payload-pp",
            "payload-auth",
            "payload-cookie",
            "payload-sid",
            "payload-deep",
            "payload-json",
            "result-basic",
            "result-auth",
            "crash-pwd",
            "crash-pp",
            "crash-cookie",
            "crash-sid",
            "ckpt-auth",
            "cost-tok",
            "cancel-pwd",
            "cancel-auth",
            "actor-pwd",
            "approval-pwd",
            "missing-pwd",
        ]
    )
}
PLANTED = [ENV_SECRET, *SECRETS.values()]


def _plant(db: Path, url: str) -> None:
    t0 = time.time() - 60
    history = [
        {
            "at": t0,
            "attempt": 1,
            "error_class": "RuntimeError",
            "message": f"pwd={SECRETS['crash-pwd']} and passphrase: {SECRETS['crash-pp']}",
            "exit_code": 1,
        },
        {
            "at": t0 + 1,
            "attempt": 2,
            "error_class": f"Err {ENV_SECRET}",
            "message": {"cookie": SECRETS["crash-cookie"]},
            "exit_code": 1,
        },
        {"at": t0 + 2, "event": "note", "message": f"Cookie: a=1; sid={SECRETS['crash-sid']}"},
    ]
    insert_row(
        db,
        "job-sec",
        f"deployer token={SECRETS['agent-tok']} {ENV_SECRET}",
        {
            "pwd": SECRETS["payload-pwd"],
            "passphrase": SECRETS["payload-pp"],
            "Auth": SECRETS["payload-auth"],
            "cookie": SECRETS["payload-cookie"],
            "note": f"set-cookie: sid={SECRETS['payload-sid']}; Path=/",
            "deep": [{"x": {"PassPhrase": SECRETS["payload-deep"]}}],
            "json": orjson.dumps({"password": SECRETS["payload-json"]}).decode(),
        },
        error=orjson.dumps(history).decode(),
        result=orjson.dumps(
            {
                "authorization": f"Basic {SECRETS['result-basic']}",
                "text": f"auth={SECRETS['result-auth']} done",
            }
        ).decode(),
        checkpoint_id=f"ckpt auth={SECRETS['ckpt-auth']}",
        tokens_consumed=orjson.dumps(
            {"input": 5, "output": 6, "cost_usd": f"token={SECRETS['cost-tok']}"}
        ).decode(),
    )

    async def park() -> None:
        store = store_from_url(url)
        await store.open()
        try:
            await store.create_job("job-park", "deployer", {})
            await store.claim("job-park", 1)
            tool = f"deploy pwd={SECRETS['approval-pwd']}"
            await store.request_approval("job-park", 1, ApprovalRequest("job-park/0/1", "d1", tool, 0, 1))
        finally:
            await store.close()

    anyio.run(park)


def test_no_secret_a_row_holds_reaches_any_page_or_the_timeline_drawn_from_its_history(
    tmp_path: Path,
) -> None:
    db = tmp_path / "agentlife.db"
    env = agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=f"sqlite:///{db}")
    assert cli_in_process("db", "init", env=env).returncode == 0
    _plant(db, env["AGENTLIFE_DATABASE_URL"])
    reason = f"pwd={SECRETS['cancel-pwd']} auth={SECRETS['cancel-auth']}"
    actor = f"sre pwd={SECRETS['actor-pwd']}"  # not a secret's place, but masked like every other text
    cancelled = cli_in_process("job", "cancel", "job-sec", "--reason", reason, "--actor", actor, env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    # The console's own pod: another data dir, so no journal of these jobs is readable.
    console_env = {**env, "AGENTLIFE_DATA_DIR": str(tmp_path / "console"), "CONSOLE_SECRET_TOKEN": ENV_SECRET}
    proc, url = start_console(console_env)
    try:
        pages = {
            path: request(url + path)
            for path in (
                "",
                "job?id=job-sec",
                "job?id=job-park",
                "job/state?id=job-sec",
                "job?id=" + f"pwd={SECRETS['missing-pwd']}",
            )
        }
    finally:
        err = stop(proc)
    assert [status for status, _, _ in pages.values()] == [200, 200, 200, 200, 404]
    for path, (_, body, _) in pages.items():
        for secret in PLANTED:
            assert secret not in body, (path, secret)
    assert not any(secret in err for secret in PLANTED)
    job = pages["job?id=job-sec"][1]
    # The timeline is there, drawn from the crash history, and says what happened with the values masked.
    assert "From the row's crash history." in job and "<svg" in job
    svg = job[job.index("<svg") : job.index("</svg>")]
    assert "<title>RuntimeError: pwd=*** and passphrase: ***</title>" in svg
    assert "<title>Cancelled by sre pwd=***: pwd=*** auth=***</title>" in svg
    assert "<li>" in job[job.index('id="h-history"') :] and job.count("***") >= 20
    assert "deploy pwd=***" in pages["job?id=job-park"][1]


def test_job_show_prints_the_console_s_job_view_with_the_same_secrets_masked(tmp_path: Path) -> None:
    # `job show` and the console's job page are one view masked by one Masker: each secret a row can hold
    # (payload, result, crash record, cancel reason, parked call, and a wait's fields) is masked on the
    # terminal as on the page.
    db = tmp_path / "agentlife.db"
    env = agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=f"sqlite:///{db}", OPERATOR_TOKEN=ENV_SECRET)
    assert cli_in_process("db", "init", env=env).returncode == 0
    _plant(db, env["AGENTLIFE_DATABASE_URL"])
    wait_secrets = {"wait-token": "wait-token-91-zq", "wait-event": "wait-event-92-zq"}
    waiting = {
        "kind": "event",
        "events": [f"approved pwd={wait_secrets['wait-event']}"],
        "token": wait_secrets["wait-token"],
        "until": time.time() + 600,
    }
    insert_row(db, "job-wait", "deployer", {}, status="WAITING", waiting=orjson.dumps(waiting).decode())
    reason = f"pwd={SECRETS['cancel-pwd']} auth={SECRETS['cancel-auth']}"
    actor = f"sre pwd={SECRETS['actor-pwd']}"  # not a secret's place, but masked like every other text
    cancelled = cli_in_process("job", "cancel", "job-sec", "--reason", reason, "--actor", actor, env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    shown = {job: cli_in_process("job", "show", job, env=env) for job in ("job-sec", "job-park", "job-wait")}
    for job, proc in shown.items():
        assert proc.returncode == 0, (job, proc.stderr)
        for secret in [*PLANTED, *wait_secrets.values()]:
            assert secret not in proc.stdout + proc.stderr, (job, secret)
    sec = shown["job-sec"].stdout
    assert (
        "RuntimeError: pwd=*** and passphrase: ***" in sec
        and "Cancelled by sre pwd=*** pwd=*** auth=***" in sec
    )
    assert '"pwd": "***"' in sec and "crash history (4)" in sec
    assert "waits for   deploy pwd=*** (job-park/0/1, digest d1)" in shown["job-park"].stdout
    assert "waits for   event 'approved pwd=***' until " in shown["job-wait"].stdout
