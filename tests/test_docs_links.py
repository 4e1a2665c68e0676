"""The docs pages without building the site: every page is linked from the index, every README link
exists on disk (the strict site build and the API reference are checked in ``e2e/test_docs.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_docs_page_is_linked_from_the_index() -> None:
    index = (REPO / "docs" / "index.md").read_text()
    linked = {m for m in re.findall(r"\]\(([\w.-]+\.md)(?:#[^)]*)?\)", index)}
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"index.md"}
    assert pages - linked == set(), f"pages missing from docs/index.md: {sorted(pages - linked)}"


def test_every_relative_link_of_the_readme_exists_on_disk() -> None:
    # The README is read on GitHub too, where the site's rewriting does not happen.
    for target in re.findall(r"\]\((?!https?:)([^)#\s]+)", (REPO / "README.md").read_text()):
        assert (REPO / target).exists(), target
