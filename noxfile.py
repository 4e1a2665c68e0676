"""Sessions: tests, lint, typecheck (the default set, run by CI), bench, chaos, soak, docs."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

PYTHON = "3.11"


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole test suite, against real PostgreSQL, Qdrant local mode, anthropic SDK and processes."""
    session.install("-e", ".[all,test]")
    session.run("pytest", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install("ruff==0.17.6")  # pinned: a new ruff release must not fail an unchanged tree
    session.run("ruff", "check", "src", "tests", "benchmarks", "examples", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "benchmarks", "examples", "noxfile.py")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy strict on src/, plus the typed usage file that shows the public API as users write it."""
    session.install("-e", ".[all,test]", "mypy==2.4.1")
    session.run("mypy")
    session.run("mypy", "--strict", "tests/typing/api_usage.py")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Every benchmarks/bench_*.py against a baseline measured in the same run; writes docs/performance.md."""
    session.install("-e", ".[all,test]")
    session.run("python", "benchmarks/run.py", *session.posargs)


@nox.session(python=PYTHON)
def chaos(session: nox.Session) -> None:
    """Fault injection over real processes and a real PostgreSQL; fails unless every bad column is 0."""
    session.install("-e", ".[all,test]")
    session.run("python", "benchmarks/chaos.py", *session.posargs)


@nox.session(python=PYTHON)
def soak(session: nox.Session) -> None:
    """Many jobs in sequence and several agents at once; RSS and open fds must not grow."""
    session.install("-e", ".[all,test]")
    session.run("python", "benchmarks/soak.py", *session.posargs)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build docs/ into a static site (site/) and fail on broken links."""
    session.install("-e", ".")
    session.run("python", "docs/build.py", "--strict")
