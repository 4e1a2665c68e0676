"""The docs: no broken relative link or anchor, every page reachable from the index, a working site build.

``docs/build.py`` is loaded in-process, so the link check costs a fraction of a second here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path, PurePosixPath
from types import ModuleType
from urllib.parse import urlsplit

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agentlife_docs_build", REPO / "docs" / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


build = _load_build()


@pytest.fixture(scope="module")
def site() -> object:
    return build.collect_pages(REPO)


def test_no_relative_link_or_anchor_is_broken(site: object) -> None:
    problems = build.check_links(site)
    assert not problems, "\n".join(str(p) for p in problems)


def test_the_site_covers_readme_changelog_and_every_docs_page(site: object) -> None:
    pages = set(site.pages)  # type: ignore[attr-defined]
    expected = {PurePosixPath("README.md"), PurePosixPath("CHANGELOG.md")}
    expected |= {PurePosixPath("docs", p.name) for p in (REPO / "docs").glob("*.md")}
    assert expected <= pages


def test_every_docs_page_is_linked_from_the_index(site: object) -> None:
    index = site.pages[PurePosixPath("docs/index.md")]  # type: ignore[attr-defined]
    linked = {
        PurePosixPath("docs", PurePosixPath(urlsplit(link).path).name)
        for link in index.rendered.links
        if not urlsplit(link).scheme
        and "/" not in urlsplit(link).path
        and urlsplit(link).path.endswith(".md")
    }
    pages = {PurePosixPath("docs", p.name) for p in (REPO / "docs").glob("*.md")} - {
        PurePosixPath("docs/index.md")
    }
    assert pages - linked == set(), f"pages missing from docs/index.md: {sorted(map(str, pages - linked))}"


def test_strict_fails_on_a_missing_page_and_a_missing_anchor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# Home\n\nSee [the guide](docs/guide.md#setup), [its bad part](docs/guide.md#nope)"
        " and [gone](docs/gone.md).\n"
    )
    (tmp_path / "docs" / "guide.md").write_text(
        "# Guide\n\n## Setup\n\nBack [home](../README.md#home), [out](../../outside.md), [here](#setup),"
        " [nowhere](#missing), [code](../src/x.py), `[not a link](nope.md)`.\n\n"
        "```python\n[also not](nope.md)\n```\n"
    )
    assert build.main(["--strict", "--check-only", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "README.md: broken link 'docs/guide.md#nope': no heading with id #nope in docs/guide.md" in err
    assert "README.md: broken link 'docs/gone.md': docs/gone.md does not exist" in err
    assert "docs/guide.md: broken link '../../outside.md': points outside the repository" in err
    assert "docs/guide.md: broken link '#missing': no heading with id #missing in this page" in err
    assert "docs/guide.md: broken link '../src/x.py': src/x.py does not exist" in err
    assert "nope.md" not in err  # code spans and code blocks hold no links
    assert err.count("error: ") == 5 and "5 broken link(s)" in err
    # Without --strict the same problems are warnings and the build goes on.
    assert build.main(["--check-only", "--root", str(tmp_path)]) == 0


def test_the_site_is_written_with_rewritten_links(tmp_path: Path) -> None:
    out = tmp_path / "site"
    assert build.build(REPO, out, strict=True) == 0
    home = (out / "index.html").read_text()
    assert (
        'href="docs/lifecycle-and-drain.html"' in home
    )  # README.md is the home page; .md links become .html
    lifecycle = (out / "docs" / "lifecycle-and-drain.html").read_text()
    assert 'id="exit-codes"' in lifecycle and 'href="probes.html#decision-matrix"' in lifecycle
    assert '<pre class="mermaid">' in lifecycle  # the state diagram, with its plain-text fallback after it
    assert (out / "docs" / "testing.html").exists() and (out / "CHANGELOG.html").exists()
    assert (out / "examples" / "release_notes_agent.py").exists()  # linked files are copied
    assert (out / "examples" / "deploy" / "index.html").exists()  # a directory's README is its index


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Exit codes: what the control plane should do", "exit-codes-what-the-control-plane-should-do"),
        (
            "Phase budget: `derive_total_timeout` and `python -m agentlife budget`",
            "phase-budget-derive_total_timeout-and-python--m-agentlife-budget",
        ),
        ("The drain, step by step", "the-drain-step-by-step"),
        (
            "`ScriptedLLM`: scripted streams for tests and the demo",
            "scriptedllm-scripted-streams-for-tests-and-the-demo",
        ),
        (
            "Measured (`python benchmarks/bench_journal.py`, 2 shared cores)",
            "measured-python-benchmarksbench_journalpy-2-shared-cores",
        ),
    ],
)
def test_heading_ids_follow_github(heading: str, slug: str) -> None:
    # The same links must work on GitHub and in the site.
    assert build.render_markdown(f"## {heading}\n").ids == [slug]


def test_the_converter_handles_the_constructs_the_docs_use() -> None:
    text = (
        "# T\n\n## A\n\n## A\n\n"
        "| a | b |\n|---|:-:|\n| `x \\| y` | [l](p.md) |\n\n"
        "- one\n  continued\n  - nested **bold**\n- two_with_underscores and *em*\n\n"
        "1. first\n2. second\n\n> quoted `code`\n"
    )
    rendered = build.render_markdown(text, lambda href: href.replace(".md", ".html"))
    assert rendered.title == "T"
    assert rendered.ids == ["t", "a", "a-1"]  # duplicate headings are numbered, as on GitHub
    assert rendered.links == ["p.md"]
    html = rendered.html
    assert "<td><code>x | y</code></td>" in html  # an escaped pipe stays inside its cell
    assert '<td style="text-align:center"><a href="p.html">l</a></td>' in html
    assert "<li>one\ncontinued<ul><li>nested <strong>bold</strong></li></ul></li>" in html
    assert "two_with_underscores and <em>em</em>" in html
    assert "<ol><li>first</li><li>second</li></ol>" in html
    assert "<blockquote><p>quoted <code>code</code></p></blockquote>" in html
