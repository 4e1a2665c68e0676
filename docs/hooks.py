"""MkDocs hooks: the pages that live outside docs/, and the API reference generated from ``__all__``.

The Markdown in docs/ links the way GitHub reads it (``../README.md``, ``../examples/…``), so the same
files work on GitHub and in the site: these hooks add the README, the changelog and the examples as
pages, rewrite those links to them, and generate one reference page per public namespace from its
``__all__``, so a new public name is documented the day it is exported.
"""

from __future__ import annotations

import importlib
import os.path
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent

#: Reference page -> (namespace, what it is).
REFERENCE = {
    "reference/agentlife.md": ("agentlife", "The agent API: everything `import agentlife` exports."),
    "reference/testing.md": ("agentlife.testing", "Test helpers: the harness, drains, fake servers."),
    "reference/constants.md": ("agentlife.constants", "Every timing and budget, with its invariants."),
    "reference/stores.md": ("agentlife.stores", "The checkpoint stores and their schema."),
}

#: Files at the repository's top that are pages of the site, under project/.
PROJECT_PAGES = ("README.md", "CHANGELOG.md", "CONTRIBUTING.md")

_LINK = re.compile(r"\]\((?P<target>[^)\s#]*)(?P<anchor>#[^)\s]*)?\)")


def public_names(namespace: str) -> list[str]:
    """The sorted ``__all__`` of ``namespace`` (the reference pages list exactly these)."""
    module = importlib.import_module(namespace)
    return sorted(name for name in module.__all__ if not name.startswith("_"))


def reference_page(namespace: str, blurb: str) -> str:
    """A reference page: one mkdocstrings block per public name."""
    parts = [f"# `{namespace}`\n\n{blurb}\n"]
    for name in public_names(namespace):
        parts.append(f"::: {namespace}.{name}\n")
    return "\n".join(parts)


def example_page(path: Path) -> str:
    """An example file as a page: its source in a code block."""
    language = {".py": "python", "": "dockerfile"}.get(path.suffix, "text")
    return f"# `examples/{path.relative_to(ROOT / 'examples')}`\n\n```{language}\n{path.read_text()}```\n"


def examples_index() -> str:
    """The examples directory as a page: what each file is for."""
    lines = ["# Examples\n", "Agents and deployment recipes to copy.\n"]
    for path in sorted((ROOT / "examples").rglob("*")):
        if path.is_file() and path.suffix in (".py", ".md", ".txt", ""):
            relative = path.relative_to(ROOT / "examples").as_posix()
            target = relative if path.suffix == ".md" else f"{relative}.md"
            lines.append(f"- [`{relative}`]({target})")
    return "\n".join(lines) + "\n"


def on_files(files: Files, config: Any) -> Files:
    """Add the README, the changelog, the examples and the generated reference pages."""
    for name in PROJECT_PAGES:
        files.append(File.generated(config, f"project/{name}", content=(ROOT / name).read_text()))
    for path in sorted((ROOT / "examples").rglob("*")):
        if path.is_file() and path.suffix in (".py", ".md", ".txt", ""):
            uri = f"examples/{path.relative_to(ROOT / 'examples')}"
            if path.suffix != ".md":
                uri += ".md"
            content = path.read_text() if path.suffix == ".md" else example_page(path)
            files.append(File.generated(config, uri, content=content))
    files.append(File.generated(config, "examples/index.md", content=examples_index()))
    for uri, (namespace, blurb) in REFERENCE.items():
        files.append(File.generated(config, uri, content=reference_page(namespace, blurb)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Point links written for GitHub at the pages these hooks added."""
    uri = Path(page.file.src_uri)
    here = uri.parent
    source_dir = _source_dir(uri)

    def rewrite(match: re.Match[str]) -> str:
        target, anchor = match["target"], match["anchor"] or ""
        if not target or "://" in target or target.startswith("mailto:"):
            return match[0]
        site_uri = _site_uri((source_dir / target).resolve())
        if site_uri is None:
            return match[0]
        return f"]({Path(os.path.relpath(site_uri, here.as_posix() or '.')).as_posix()}{anchor})"

    return _LINK.sub(rewrite, markdown)


def _source_dir(uri: Path) -> Path:
    """The repository directory a page's Markdown was written in (its links are relative to it)."""
    if uri.parts[0] == "project":
        return ROOT
    if uri.parts[0] == "examples":
        return ROOT / uri.parent
    return ROOT / "docs" / uri.parent


def _site_uri(path: Path) -> str | None:
    """Where a repository file is in the site, or None when it is not a page of it."""
    try:
        relative = path.relative_to(ROOT)
    except ValueError:
        return None
    parts = relative.parts
    if parts and parts[0] == "docs":
        return Path(*parts[1:]).as_posix() if len(parts) > 1 else "index.md"
    if relative.as_posix() in PROJECT_PAGES:
        return f"project/{relative.as_posix()}"
    if parts and parts[0] == "examples":
        if path.is_dir():
            return f"{relative.as_posix()}/{'README.md' if (path / 'README.md').exists() else 'index.md'}"
        return relative.as_posix() if path.suffix == ".md" else f"{relative.as_posix()}.md"
    return None
