"""tests/ mirrors src/agentlife/ as CONTRIBUTING.md's map says, and nothing else sits in it.

Every folder the map of the code names exists under src/agentlife/; every folder of tests/ is a package's
(its name without the leading underscore), tests/e2e/ or a support folder; test file names are unique (the
folders are not packages, so pytest imports each file by its name).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src" / "agentlife"
TESTS = REPO / "tests"
SUPPORT = {"agents", "typing", "e2e"}


def _map_rows() -> list[str]:
    """The first cell of each row of CONTRIBUTING's table of folders, e.g. ``stores/`` or ``_cli/``."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    section = text.split("## Where each capability lives", 1)[1].split("\n## ", 1)[0]
    return [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")]


def _named_folders() -> set[str]:
    return {name for row in _map_rows() for name in re.findall(r"`([\w.]+)/`", row)}


def _packages() -> set[str]:
    return {p.parent.name for p in SRC.glob("*/__init__.py")}


def test_every_folder_the_map_names_is_a_package_and_every_package_is_named() -> None:
    named = _named_folders()
    assert named, "CONTRIBUTING.md's map of the code names no folder"
    assert named == _packages()


def test_every_test_folder_is_a_package_or_e2e_or_support() -> None:
    packages = {name.lstrip("_") for name in _packages()}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert folders - packages - SUPPORT == set()
    assert "e2e" in folders


def test_the_section_on_tests_names_every_test_folder() -> None:
    text = (REPO / "CONTRIBUTING.md").read_text()
    section = text.split("## Where a module's tests live", 1)[1].split("\n## ", 1)[0]
    folders = {p.name for p in TESTS.iterdir() if any(p.glob("test_*.py"))} - {"e2e"}
    assert {name for name in folders if f"`{name}/`" not in section} == set()
    assert "`tests/e2e/`" in section


def test_test_file_names_are_unique_and_support_folders_hold_no_tests() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
    assert [p for folder in ("agents", "typing") for p in (TESTS / folder).rglob("test_*.py")] == []
    assert list(TESTS.rglob("__init__.py")) == list((TESTS / "agents").glob("__init__.py"))
