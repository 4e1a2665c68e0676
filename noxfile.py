"""Sessions: lint, typecheck, tests (the default set, run by CI), bench, chaos, soak, docs, package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import nox

# The quick sessions first: a slow one (tests) fails last, and the browser install (below) overlaps lint
# and typecheck.
nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_venv = "yes"
# uv installs the sessions' packages in seconds where pip takes about half a minute each; without uv on PATH,
# nox falls back to virtualenv and pip.
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.error_on_missing_interpreters = True

PYTHON = "3.11"
BROWSER = ("/usr/bin/chromium", "/usr/bin/chromedriver")


def _start_browser_install() -> subprocess.Popen[bytes] | None:
    """Install Debian's chromium and chromium-driver in the background when missing and we may (root).

    The console's tests drive a real headless Chromium and fail, never skip, without it: on a fresh
    machine the README's test command installs it, as CI does.
    """
    if all(os.access(path, os.X_OK) for path in BROWSER):
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return None  # the tests say what is missing
    script = "apt-get update -qq && apt-get install -y -qq chromium chromium-driver"
    log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "agentlife-chromium-install.log"), "wb")  # noqa: SIM115
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.Popen(["sh", "-c", script], stdout=log, stderr=log, env=env)


# Plain ``nox`` (the README's command, CI) starts it now, to overlap lint and typecheck; ``nox -s tests``
# installs it when the session starts.
_BROWSER_INSTALL = _start_browser_install() if sys.argv[1:] == [] else None


def _wait_for_browser(session: nox.Session) -> None:
    install = _BROWSER_INSTALL or _start_browser_install()
    if install is not None and install.wait() != 0:
        session.warn(
            "installing chromium failed (see agentlife-chromium-install.log): the console tests will fail"
        )


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole test suite, against real PostgreSQL, Qdrant local mode, anthropic SDK and processes."""
    session.install("-e", ".[all,test,docs]")  # docs: the suite builds the site in strict mode
    _wait_for_browser(session)
    # One pytest worker per core and one more: most tests wait on processes, servers and timers, and the extra
    # worker runs while the others wait (measured on 2 cores: 3 workers ~10% faster than 2). Each worker
    # starts its own PostgreSQL; the slow tests start first, one per worker (conftest.py). A part (posargs)
    # runs serially.
    workers = str((os.cpu_count() or 1) + 1)
    parallel = [] if session.posargs else ["-n", workers, "--dist", "worksteal"]
    # The suite starts hundreds of Python processes: with PYTHONDONTWRITEBYTECODE set (as on this project's
    # machines) each compiled agentlife and its dependencies from source again. Compile once, up front.
    session.run("python", "-m", "compileall", "-q", "-j", "0", "src", "tests", silent=True)
    session.run("pytest", *parallel, *session.posargs, env={"PYTHONDONTWRITEBYTECODE": ""})


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install("ruff==0.17.6")  # pinned: a new ruff release must not fail an unchanged tree
    paths = ["src", "tests", "benchmarks", "examples", "docs/hooks.py", "noxfile.py"]
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy strict on src/, plus the typed usage file that shows the public API as users write it."""
    session.install("-e", ".[all,test]", "mypy==2.4.1")
    session.run("mypy")
    session.run("mypy", "--strict", "tests/typing/api_usage.py")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Every benchmarks/bench_*.py against a baseline measured in the same run; writes docs/performance.md."""
    # agentlife's own dependencies only, as in a pod: the test extra brings selenium, whose trio httpcore
    # imports whenever it is installed (~50 ms on every start-up figure).
    session.install("-e", ".[all]")
    session.run("python", "benchmarks/run.py", *session.posargs)


@nox.session(python=PYTHON)
def chaos(session: nox.Session) -> None:
    """Fault injection over real processes and a real PostgreSQL; fails unless every bad column is 0."""
    session.install("-e", ".[all,test]")
    session.run("python", "benchmarks/chaos.py", *session.posargs)
    # Every variant the suite leaves out: each real-process test on both stores, every seed (the seeded
    # SIGKILL loops with each attempt on a random pod's disk among them).
    session.run("pytest", "-q", "-n", "3", "tests", env={"AGENTLIFE_TESTS_EXHAUSTIVE": "1"})
    # The worker pool: 300 jobs, 32 SIGKILLs and 32 SIGTERMs of its 3 workers, once one job at a time and
    # once --concurrency 10 running a tool agent against the fake model server with 200 ms latency (the
    # suite runs 30 / 3 / 3 with 3 workers, and 16 / 2 / 2 at --concurrency 4 with 50 ms).
    session.run(
        "pytest",
        "-q",
        "-s",
        "tests/e2e/test_worker_chaos.py",
        env={
            "WORKER_CHAOS_JOBS": "300",
            "WORKER_CHAOS_SIGKILLS": "32",
            "WORKER_CHAOS_SIGTERMS": "32",
            "WORKER_CHAOS_WORKERS": "3",
            "WORKER_CHAOS_CONCURRENCY": "10",
            "WORKER_CHAOS_LATENCY": "0.2",
        },
    )


@nox.session(python=PYTHON)
def fleet(session: nox.Session) -> None:
    """A fleet on one provider account with fleet-wide rate limits and without; adds it to performance.md.

    Full scale by default (300 jobs, 3 workers x --concurrency 50, 600 RPM, 200 000 input tokens a
    minute); FLEET_JOBS, FLEET_WORKERS, FLEET_CONCURRENCY, FLEET_RPM, FLEET_INPUT_TPM, FLEET_LATENCY and
    FLEET_PAYLOAD_BYTES shrink it for a smaller machine.
    """
    session.install("-e", ".[all]")
    session.run("python", "benchmarks/run.py", "--only", "fleet", "--timeout", "3600", *session.posargs)


@nox.session(python=PYTHON)
def soak(session: nox.Session) -> None:
    """Many jobs in sequence and several agents at once; RSS and open fds must not grow."""
    session.install("-e", ".[all,test]")
    session.run("python", "benchmarks/soak.py", *session.posargs)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the site with MkDocs (site/): strict, so a broken link, anchor or reference fails it."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session(python=PYTHON)
def package(session: nox.Session) -> None:
    """Build the sdist and wheel, check them with twine, install the wheel in a fresh venv, run the demo."""
    import shutil
    import tempfile
    from pathlib import Path

    session.install("build==1.6.1", "twine==7.0.0")
    dist = Path(tempfile.mkdtemp(prefix="agentlife-dist-"))
    session.run("python", "-m", "build", "--outdir", str(dist))
    session.run("twine", "check", "--strict", *(str(p) for p in dist.iterdir()))
    (wheel,) = dist.glob("*.whl")
    venv = dist / "venv"
    session.run("python", "-m", "venv", str(venv))
    python = str(venv / "bin" / "python")
    session.run(python, "-m", "pip", "install", "--quiet", f"{wheel}[all]", external=True)
    work = dist / "demo"
    work.mkdir()
    # From a directory without the source tree, so only the installed wheel can be imported.
    session.run(
        python,
        "-c",
        "import agentlife, pathlib; assert 'site-packages' in agentlife.__file__; "
        "assert (pathlib.Path(agentlife.__file__).parent / 'py.typed').exists(); "
        # The console's page and its script and style ship in the wheel (no build step, no CDN).
        "console = pathlib.Path(agentlife.__file__).parent / '_console'; "
        "assert (console / 'templates' / 'base.html').exists(); "
        "assert {p.suffix for p in (console / 'static').iterdir()} >= {'.js', '.css'}",
        external=True,
    )
    session.chdir(str(work))
    session.run(python, "-m", "agentlife", "--version", external=True)
    session.run(python, "-m", "agentlife", "demo", "--data-dir", str(work / "data"), external=True)
    shutil.rmtree(dist)
