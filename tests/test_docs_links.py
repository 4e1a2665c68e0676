"""The docs site: MkDocs builds it in strict mode (broken links and anchors fail it), every page is in it,
and the API reference lists every public name, generated from ``__all__``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = _mkdocs(REPO / "mkdocs.yml", out)
    assert built.returncode == 0, built.stderr
    return out


def test_every_docs_page_is_linked_from_the_index() -> None:
    index = (REPO / "docs" / "index.md").read_text()
    linked = {m for m in re.findall(r"\]\(([\w.-]+\.md)(?:#[^)]*)?\)", index)}
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"index.md"}
    assert pages - linked == set(), f"pages missing from docs/index.md: {sorted(pages - linked)}"


def test_every_relative_link_of_the_readme_exists_on_disk() -> None:
    # The README is read on GitHub too, where the site's rewriting does not happen.
    for target in re.findall(r"\]\((?!https?:)([^)#\s]+)", (REPO / "README.md").read_text()):
        assert (REPO / target).exists(), target
