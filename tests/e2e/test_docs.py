"""The docs site: MkDocs builds it in strict mode (broken links and anchors fail it), every page is in it,
and the API reference lists every public name, generated from ``__all__``.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
NAMESPACES = {
    "agentlife": "reference/agentlife",
    "agentlife.testing": "reference/testing",
    "agentlife.constants": "reference/constants",
    "agentlife.stores": "reference/stores",
}


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "DOCS_SEARCH_INDEX": "false"},
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


@pytest.mark.parametrize("namespace", sorted(NAMESPACES))
def test_the_reference_documents_every_public_name(site: Path, namespace: str) -> None:
    html = (site / NAMESPACES[namespace] / "index.html").read_text()
    names = [n for n in importlib.import_module(namespace).__all__ if not n.startswith("_")]
    missing = [name for name in names if f'id="{namespace}.{name}"' not in html]
    assert not missing, f"not in the API reference: {missing}"


def _field_anchors(namespace: str) -> list[str]:
    """``namespace.Class.field`` for every public field of its dataclasses and every member of its enums."""
    module = importlib.import_module(namespace)
    anchors = []
    for name in module.__all__:
        obj = getattr(module, name)
        if not inspect.isclass(obj):
            continue
        if dataclasses.is_dataclass(obj):
            members = [f.name for f in dataclasses.fields(obj)]
        elif issubclass(obj, enum.Enum):
            members = [m.name for m in obj]
        else:
            continue
        anchors += [f"{namespace}.{name}.{m}" for m in members if not m.startswith("_")]
    return anchors


@pytest.mark.parametrize("namespace", sorted(NAMESPACES))
def test_the_reference_describes_every_dataclass_field_and_enum_member(site: Path, namespace: str) -> None:
    # mkdocstrings gives a member an entry (and its anchor) only when it has a docstring of its own.
    html = (site / NAMESPACES[namespace] / "index.html").read_text()
    anchors = _field_anchors(namespace)
    assert len(anchors) > 10
    missing = [anchor for anchor in anchors if f'id="{anchor}"' not in html]
    assert not missing, f"fields or members without a description in the reference: {missing}"


def test_the_reference_describes_not_done_and_links_the_type_of_ctx_llm(site: Path) -> None:
    html = (site / "reference" / "agentlife" / "index.html").read_text()
    not_done = html[html.index('id="agentlife.NOT_DONE"') :][:3000]
    assert "verify" in re.sub(r"<[^>]+>", "", not_done)
    step_context = html[html.index('id="agentlife.StepContext"') :][:6000]
    assert 'href="#agentlife.StepLLM"' in step_context  # the llm attribute links to its type's entry
    assert 'id="agentlife.StepLLM.complete"' in html and 'id="agentlife.StepLLM.stream"' in html


def test_the_site_has_every_docs_page_the_readme_the_changelog_and_the_examples(site: Path) -> None:
    for page in (REPO / "docs").glob("*.md"):
        target = site / "index.html" if page.stem == "index" else site / page.stem / "index.html"
        assert target.exists(), page.name
    assert (site / "project" / "index.html").exists()  # the README
    assert (site / "project" / "CHANGELOG" / "index.html").exists()
    assert (site / "examples" / "release_notes_agent.py" / "index.html").exists()


def test_links_written_for_github_point_at_the_site_pages(site: Path) -> None:
    readme = (site / "project" / "index.html").read_text()
    assert 'href="../lifecycle-and-drain/"' in readme  # docs/lifecycle-and-drain.md in the README
    index = (site / "index.html").read_text()
    assert 'href="project/"' in index and 'href="examples/release_notes_agent.py/"' in index


def test_the_state_diagram_renders_with_mermaid(site: Path) -> None:
    assert 'class="mermaid"' in (site / "lifecycle-and-drain" / "index.html").read_text()


def test_strict_fails_on_a_missing_page_and_a_missing_anchor(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs, ignore=shutil.ignore_patterns("hooks.py"))
    (docs / "testing.md").write_text(
        (docs / "testing.md").read_text() + "\n[gone](gone.md) and [bad anchor](probes.md#no-such-heading)\n"
    )
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        f"INHERIT: {REPO / 'mkdocs.yml'}\ndocs_dir: {docs}\nhooks:\n  - {REPO / 'docs' / 'hooks.py'}\n"
        f"plugins:\n  - search\n"
    )
    built = _mkdocs(config, tmp_path / "site")
    assert built.returncode == 1
    assert "'gone.md', but the target is not found" in built.stderr
    assert "does not contain an anchor '#no-such-heading'" in built.stderr
