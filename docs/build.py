"""Build the documentation into a static HTML site and check every relative link.

Usage::

    python docs/build.py [--strict] [--out site] [--root REPO] [--check-only]

The site mirrors the repository's layout, so a relative link means the same thing on GitHub and in the
site: ``README.md`` becomes the home page (``site/index.html``), ``docs/x.md`` becomes ``site/docs/x.html``,
a directory's ``README.md`` becomes its ``index.html``. Pages are ``README.md``, ``CHANGELOG.md``,
``docs/*.md`` and every other Markdown file they link to; other files they link to (an example agent, a
Dockerfile) are copied as they are, and a linked directory without a README gets a listing page.

Every relative link and image of every page is checked: the target must exist inside the repository, and
an ``#anchor`` must name a heading of the target page (GitHub's heading ids). ``--strict`` turns any broken
link into exit status 1; without it they are printed as warnings.

The Markdown converter is a small one, in this file, for the subset the docs use (GitHub-flavoured:
headings, paragraphs, nested lists, pipe tables, fenced code, block quotes, links, images, emphasis, code
spans, autolinks), so building the docs needs nothing beyond the standard library. A ``mermaid`` code
block is rendered by mermaid.js when the page is viewed online; each one is followed in the source by a
plain-text fallback.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

__all__ = [
    "LinkProblem",
    "Page",
    "build",
    "check_links",
    "collect_pages",
    "main",
    "render_markdown",
    "slugify",
]

REPO = Path(__file__).resolve().parent.parent
#: Always part of the site, when they exist; everything else is reached through links.
ROOTS = ("README.md", "CHANGELOG.md")
_SKIP_DIRS = {".git", ".venv", ".nox", "__pycache__", "site", "node_modules"}

# -- Markdown ------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")
_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_HR = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_LIST_ITEM = re.compile(r"^( *)([-*+]|\d{1,9}[.)])( +|$)(.*)$")
_QUOTE = re.compile(r"^ {0,3}> ?(.*)$")
_TABLE_DELIM = re.compile(r"^ *\|? *:?-+:? *(\| *:?-+:? *)*\|? *$")
_HTML_BLOCK = re.compile(r"^ {0,3}<(/?(?:div|details|summary|table|section|p|pre|img|a|br|hr)\b|!--)", re.I)
_PLACEHOLDER = re.compile("\x00(\\d+)\x00")
_ESCAPABLE = set("\\`*_{}[]()#+-.!|<>~\"'=:;,/&$%@^?")
_BARE_URL = re.compile(r"(?<![\w/\"'=])(https?://[^\s<>\x00]*[^\s<>\x00.,:;!?\"')\]])")


def slugify(text: str) -> str:
    """The id GitHub gives a heading with plain text ``text`` (before de-duplication).

    Lower case; every character that is not a letter, digit, ``_``, ``-`` or space dropped; each space
    becomes ``-`` (runs are not collapsed, as on GitHub).
    """
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@dataclass(slots=True)
class Rendered:
    """One Markdown document turned into HTML."""

    html: str
    title: str
    ids: list[str]
    links: list[str]
    has_mermaid: bool = False


@dataclass(slots=True)
class _Block:
    kind: str  # "p" for paragraphs (unwrapped in tight lists), else "block"
    html: str


class _Converter:
    """Markdown (the GitHub subset the docs use) to HTML; collects heading ids and link targets."""

    def __init__(self, rewrite: Callable[[str], str] | None = None) -> None:
        self._rewrite = rewrite or (lambda href: href)
        self.ids: list[str] = []
        self.links: list[str] = []
        self.title = ""
        self.has_mermaid = False
        self._slug_counts: dict[str, int] = {}

    # -- blocks --------------------------------------------------------------------------------------------

    def blocks(self, lines: list[str]) -> list[_Block]:
        out: list[_Block] = []
        i = 0
        while i < len(lines):
            line = lines[i]
            if not line.strip():
                i += 1
                continue
            for parse in (
                self._fence,
                self._heading,
                self._hr,
                self._table,
                self._quote,
                self._list,
                self._html_block,
            ):
                result = parse(lines, i)
                if result is not None:
                    block, i = result
                    out.append(block)
                    break
            else:
                block, i = self._paragraph(lines, i)
                out.append(block)
        return out

    def _fence(self, lines: list[str], i: int) -> tuple[_Block, int] | None:
        m = _FENCE.match(lines[i])
        if m is None:
            return None
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3)
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                j += 1
                break
            line = lines[j]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))) :])
            j += 1
        code = html.escape("\n".join(body) + ("\n" if body else ""), quote=False)
        if lang == "mermaid":
            self.has_mermaid = True
            return _Block("block", f'<pre class="mermaid">{code}</pre>'), j
        cls = f' class="language-{html.escape(lang)}"' if lang else ""
        return _Block("block", f"<pre><code{cls}>{code}</code></pre>"), j

    def _heading(self, lines: list[str], i: int) -> tuple[_Block, int] | None:
        m = _HEADING.match(lines[i])
        if m is None:
            return None
        return self._make_heading(len(m.group(1)), m.group(2) or ""), i + 1

    def _make_heading(self, level: int, text: str) -> _Block:
        inner = self.inline(text)
        plain = html.unescape(re.sub(r"<[^>]+>", "", inner))
        slug = slugify(plain)
        count = self._slug_counts.get(slug, 0)
        self._slug_counts[slug] = count + 1
        hid = slug if count == 0 else f"{slug}-{count}"
        self.ids.append(hid)
        if level == 1 and not self.title:
            self.title = plain.strip()
        anchor = f'<a class="anchor" href="#{hid}" aria-hidden="true">#</a>'
        return _Block("block", f'<h{level} id="{hid}">{inner}{anchor}</h{level}>')

    def _hr(self, lines: list[str], i: int) -> tuple[_Block, int] | None:
        return (_Block("block", "<hr>"), i + 1) if _HR.match(lines[i]) else None

    def _table(self, lines: list[str], i: int) -> tuple[_Block, int] | None:
        if "|" not in lines[i] or i + 1 >= len(lines) or not _TABLE_DELIM.match(lines[i + 1]):
            return None
        header = _split_row(lines[i])
        aligns = [_alignment(cell) for cell in _split_row(lines[i + 1])]
        if len(aligns) != len(header):
            return None
        rows: list[list[str]] = []
        j = i + 2
        while j < len(lines) and lines[j].strip() and "|" in lines[j]:
            rows.append(_split_row(lines[j]))
            j += 1

        def cells(values: list[str], tag: str) -> str:
            padded = (values + [""] * len(aligns))[: len(aligns)]
            return "".join(
                f"<{tag}{_align_attr(a)}>{self.inline(v)}</{tag}>"
                for v, a in zip(padded, aligns, strict=True)
            )

        body = "".join(f"<tr>{cells(r, 'td')}</tr>" for r in rows)
        table = f"<table><thead><tr>{cells(header, 'th')}</tr></thead><tbody>{body}</tbody></table>"
        return _Block("block", f'<div class="table">{table}</div>'), j

    def _quote(self, lines: list[str], i: int) -> tuple[_Block, int] | None:
        if not _QUOTE.match(lines[i]):
            return None
        inner: list[str] = []
        j = i
        while j < len(lines):
            m = _QUOTE.match(lines[j])
            if m is not None:
                inner.append(m.group(1))
            elif lines[j].strip() and inner and inner[-1].strip() and not self._starts_block(lines, j):
                inner.append(lines[j])  # lazy continuation of a quoted paragraph
            else:
                break
            j += 1
        content = "".join(b.html for b in self.blocks(inner))
        return _Block("block", f"<blockquote>{content}</blockquote>"), j

    def _list(self, lines: list[str], i: int) -> tuple[_Block, int] | None:
        first = _LIST_ITEM.match(lines[i])
        if first is None or _HR.match(lines[i]):
            return None
        indent, marker = len(first.group(1)), first.group(2)
        ordered = marker[0].isdigit()
        items: list[list[str]] = []
        loose = False
        j = i
        while j < len(lines):
            m = _LIST_ITEM.match(lines[j])
            if (
                m is None
                or len(m.group(1)) != indent
                or m.group(2)[0].isdigit() != ordered
                or _HR.match(lines[j])
            ):
                break
            if not ordered and m.group(2) != marker:
                break
            content_indent = indent + len(m.group(2)) + max(1, min(len(m.group(3)), 4))
            item = [m.group(4)]
            j += 1
            while j < len(lines):
                line = lines[j]
                if not line.strip():
                    k = j
                    while k < len(lines) and not lines[k].strip():
                        k += 1
                    if k < len(lines) and _indent_of(lines[k]) >= content_indent:
                        item.extend([""] * (k - j))
                        j = k
                        loose = True
                        continue
                    nxt = _LIST_ITEM.match(lines[k]) if k < len(lines) else None
                    if (
                        nxt is not None
                        and len(nxt.group(1)) == indent
                        and nxt.group(2)[0].isdigit() == ordered
                    ):
                        loose = True
                    j = k
                    break
                if _indent_of(line) >= content_indent:
                    item.append(line[content_indent:])
                elif (m2 := _LIST_ITEM.match(line)) is not None and len(m2.group(1)) <= indent:
                    break
                elif m2 is not None:
                    item.append(
                        line[min(_indent_of(line), content_indent) :]
                    )  # a nested list, under-indented
                elif item[-1].strip() and not self._starts_block(lines, j):
                    item.append(line.strip())  # lazy continuation of the item's paragraph
                else:
                    break
                j += 1
            items.append(item)
            if j < len(lines) and not lines[j - 1].strip() and not _LIST_ITEM.match(lines[j]):
                break
        parts = []
        for item in items:
            blocks = self.blocks(item)
            if loose:
                parts.append("<li>" + "".join(b.html for b in blocks) + "</li>")
            else:
                parts.append("<li>" + "".join(_unwrap(b) for b in blocks) + "</li>")
        tag = "ol" if ordered else "ul"
        start = int(marker[:-1]) if ordered else 1
        attr = f' start="{start}"' if ordered and start != 1 else ""
        return _Block("block", f"<{tag}{attr}>{''.join(parts)}</{tag}>"), j

    def _html_block(self, lines: list[str], i: int) -> tuple[_Block, int] | None:
        if not _HTML_BLOCK.match(lines[i]):
            return None
        j = i
        while j < len(lines) and lines[j].strip():
            j += 1
        raw = "\n".join(lines[i:j])
        for m in re.finditer(r"""\b(?:id|name)\s*=\s*["']([^"']+)["']""", raw):
            self.ids.append(m.group(1))
        for m in re.finditer(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""", raw):
            self.links.append(html.unescape(m.group(1)))
        return _Block("block", raw), j

    def _starts_block(self, lines: list[str], j: int) -> bool:
        line = lines[j]
        return bool(
            _FENCE.match(line)
            or _HEADING.match(line)
            or _HR.match(line)
            or _QUOTE.match(line)
            or _LIST_ITEM.match(line)
            or _HTML_BLOCK.match(line)
            or (j + 1 < len(lines) and "|" in line and _TABLE_DELIM.match(lines[j + 1]))
        )

    def _paragraph(self, lines: list[str], i: int) -> tuple[_Block, int]:
        text = [lines[i].strip()]
        j = i + 1
        while j < len(lines) and lines[j].strip():
            setext = _SETEXT.match(lines[j])
            if setext is not None:
                level = 1 if setext.group(1)[0] == "=" else 2
                return self._make_heading(level, " ".join(text)), j + 1
            if self._starts_block(lines, j) and not _LIST_ITEM.match(lines[j]):
                break
            if (m := _LIST_ITEM.match(lines[j])) is not None and (
                not m.group(2)[0].isdigit() or m.group(2) in ("1.", "1)")
            ):
                break  # GFM: a bullet (or a list starting at 1) may interrupt a paragraph
            text.append(lines[j].strip() if not lines[j].endswith("  ") else lines[j].strip() + "  ")
            j += 1
        return _Block("p", f"<p>{self.inline(_join_lines(text))}</p>"), j

    # -- inline -------------------------------------------------------------------------------------------

    def inline(self, text: str, slots: list[str] | None = None) -> str:
        """Inline Markdown to HTML; ``slots`` holds finished fragments (shared with nested link labels)."""
        slots = [] if slots is None else slots

        def keep(fragment: str) -> str:
            assert slots is not None
            slots.append(fragment)
            return f"\x00{len(slots) - 1}\x00"

        text = self._code_spans(text, keep)
        text = re.sub(
            r"\\(.)",
            lambda m: keep(html.escape(m.group(1))) if m.group(1) in _ESCAPABLE else m.group(0),
            text,
        )
        text = re.sub(
            r"<((?:https?|mailto):[^\s<>]+)>",
            lambda m: keep(f'<a href="{html.escape(m.group(1))}">{html.escape(m.group(1))}</a>'),
            text,
        )
        text = self._links(text, keep, slots)
        text = html.escape(text, quote=False)
        text = _BARE_URL.sub(lambda m: keep(f'<a href="{m.group(1)}">{m.group(1)}</a>'), text)
        text = re.sub(r"\*\*(?=\S)(.+?)(?<=\S)\*\*", r"<strong>\1</strong>", text)
        text = re.sub(r"(?<!\w)__(?=\S)(.+?)(?<=\S)__(?!\w)", r"<strong>\1</strong>", text)
        text = re.sub(r"(?<![*\w])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?!\*)", r"<em>\1</em>", text)
        text = re.sub(r"(?<![\w_])_(?=[^\s_])(.+?)(?<=[^\s_])_(?![\w_])", r"<em>\1</em>", text)
        text = re.sub(r"~~(?=\S)(.+?)(?<=\S)~~", r"<del>\1</del>", text)
        text = text.replace("  \n", "<br>\n")
        while _PLACEHOLDER.search(text):
            text = _PLACEHOLDER.sub(lambda m: slots[int(m.group(1))], text)
        return text

    @staticmethod
    def _code_spans(text: str, keep: Callable[[str], str]) -> str:
        out: list[str] = []
        i = 0
        while i < len(text):
            if text[i] == "\\" and i + 1 < len(text) and text[i + 1] == "`":
                out.append(text[i : i + 2])
                i += 2
                continue
            if text[i] != "`":
                out.append(text[i])
                i += 1
                continue
            run = len(text[i:]) - len(text[i:].lstrip("`"))
            fence = "`" * run
            j = i + run
            close = -1
            while True:
                k = text.find(fence, j)
                if k < 0:
                    break
                if (k + run >= len(text) or text[k + run] != "`") and text[k - 1] != "`":
                    close = k
                    break
                j = k + 1
            if close < 0:
                out.append(fence)
                i += run
                continue
            code = text[i + run : close].replace("\n", " ")
            if len(code) > 2 and code[0] == " " and code[-1] == " " and code.strip():
                code = code[1:-1]
            out.append(keep(f"<code>{html.escape(code, quote=False)}</code>"))
            i = close + run
        return "".join(out)

    def _links(self, text: str, keep: Callable[[str], str], slots: list[str]) -> str:
        out: list[str] = []
        i = 0
        while i < len(text):
            image = text.startswith("![", i)
            if text[i] != "[" and not image:
                out.append(text[i])
                i += 1
                continue
            start = i + (2 if image else 1)
            end = _matching(text, start - 1, "[", "]")
            if end < 0 or end + 1 >= len(text) or text[end + 1] != "(":
                out.append(text[i])
                i += 1
                continue
            close = _matching(text, end + 1, "(", ")")
            if close < 0:
                out.append(text[i])
                i += 1
                continue
            target = text[end + 2 : close].strip()
            m = re.match(r"""^<?([^\s>]*)>?(?:\s+["'(](.*)["')])?$""", target, re.S)
            if m is None:
                out.append(text[i])
                i += 1
                continue
            # A backslash escape in the URL became a placeholder holding the escaped character.
            href = html.unescape(_PLACEHOLDER.sub(lambda p: slots[int(p.group(1))], m.group(1)))
            title = m.group(2)
            self.links.append(href)
            url = html.escape(self._rewrite(href))
            title_attr = f' title="{html.escape(title)}"' if title else ""
            label = text[start:end]
            if image:
                alt = html.escape(html.unescape(re.sub(r"<[^>]+>", "", self.inline(label, slots))))
                out.append(keep(f'<img src="{url}" alt="{alt}"{title_attr}>'))
            else:
                out.append(keep(f'<a href="{url}"{title_attr}>{self.inline(label, slots)}</a>'))
            i = close + 1
        return "".join(out)


def _matching(text: str, i: int, open_: str, close: str) -> int:
    depth = 0
    j = i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == open_:
            depth += 1
        elif ch == close:
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return -1


def _indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _unwrap(block: _Block) -> str:
    if block.kind == "p":
        return block.html[len("<p>") : -len("</p>")]
    return block.html


def _join_lines(lines: list[str]) -> str:
    return "\n".join(line.rstrip() + ("  " if line.endswith("  ") else "") for line in lines)


def _split_row(line: str) -> list[str]:
    row = line.strip()
    if row.startswith("|"):
        row = row[1:]
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    cells = re.split(r"(?<!\\)\|", row)
    return [c.strip().replace("\\|", "|") for c in cells]


def _alignment(cell: str) -> str:
    cell = cell.strip()
    if cell.startswith(":") and cell.endswith(":"):
        return "center"
    if cell.endswith(":"):
        return "right"
    return "left" if cell.startswith(":") else ""


def _align_attr(align: str) -> str:
    return f' style="text-align:{align}"' if align else ""


def render_markdown(text: str, rewrite: Callable[[str], str] | None = None) -> Rendered:
    """Convert ``text`` to HTML; ``rewrite`` maps each link target as written to the href to emit."""
    conv = _Converter(rewrite)
    lines = text.replace("\r\n", "\n").replace("\t", "    ").split("\n")
    body = "\n".join(b.html for b in conv.blocks(lines))
    return Rendered(body, conv.title, conv.ids, conv.links, conv.has_mermaid)


# -- the site ------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Page:
    """One Markdown file of the site."""

    source: PurePosixPath  # relative to the repository root
    rendered: Rendered

    @property
    def output(self) -> PurePosixPath:
        """Where the page lands in the site: ``README.md`` is its directory's ``index.html``."""
        return output_path(self.source)


@dataclass(frozen=True, slots=True)
class LinkProblem:
    """A relative link that leads nowhere."""

    page: str
    link: str
    reason: str

    def __str__(self) -> str:
        return f"{self.page}: broken link {self.link!r}: {self.reason}"


@dataclass(slots=True)
class Site:
    """The pages, the other files they link to, and the directories that need a listing."""

    root: Path
    pages: dict[PurePosixPath, Page] = field(default_factory=dict)
    files: set[PurePosixPath] = field(default_factory=set)
    listings: set[PurePosixPath] = field(default_factory=set)


def output_path(source: PurePosixPath) -> PurePosixPath:
    """The site path of a Markdown source: ``x.md`` → ``x.html``, ``dir/README.md`` → ``dir/index.html``."""
    if source.name.lower() == "readme.md":
        return source.parent / "index.html"
    return source.with_suffix(".html")


def _rel(target: PurePosixPath, start: PurePosixPath) -> str:
    return os.path.relpath(str(target), str(start)).replace(os.sep, "/")


def _resolve(root: Path, page: PurePosixPath, path: str) -> PurePosixPath | None:
    """The repository-relative path ``path`` points to from ``page``, or None when it leaves the repo."""
    joined = os.path.normpath(os.path.join(str(page.parent), unquote(path)))
    if joined == "." or not joined.startswith(".."):
        rel = PurePosixPath(joined.replace(os.sep, "/"))
        full = (root / rel).resolve()
        if full == root.resolve() or root.resolve() in full.parents:
            return rel
    return None


def _is_external(href: str) -> bool:
    return bool(urlsplit(href).scheme) or href.startswith("//")


def _readme_of(root: Path, directory: PurePosixPath) -> PurePosixPath | None:
    for name in ("README.md", "readme.md", "index.md"):
        if (root / directory / name).is_file():
            return directory / name
    return None


def collect_pages(root: Path = REPO) -> Site:
    """Render ``README.md``, ``CHANGELOG.md``, ``docs/*.md`` and every Markdown file reachable by links."""
    site = Site(root)
    queue = [PurePosixPath(name) for name in ROOTS if (root / name).is_file()]
    queue += sorted(PurePosixPath("docs") / p.name for p in (root / "docs").glob("*.md"))
    seen: set[PurePosixPath] = set()
    while queue:
        source = queue.pop(0)
        if source in seen:
            continue
        seen.add(source)

        def rewrite(href: str, source: PurePosixPath = source) -> str:
            return _site_href(site, source, href)

        rendered = render_markdown((root / source).read_text(encoding="utf-8"), rewrite)
        site.pages[source] = Page(source, rendered)
        for link in rendered.links:
            if _is_external(link) or link.startswith("#"):
                continue
            target = _resolve(root, source, urlsplit(link).path)
            if target is None or not (root / target).exists():
                continue
            if (root / target).is_dir():
                readme = _readme_of(root, target)
                if readme is not None:
                    queue.append(readme)
                else:
                    site.listings.add(target)
            elif target.suffix.lower() == ".md":
                queue.append(target)
            else:
                site.files.add(target)
    return site


def _site_href(site: Site, page: PurePosixPath, href: str) -> str:
    """The href to emit in the page built from ``page`` for ``href`` as written in its source."""
    if _is_external(href) or href.startswith("#"):
        return href
    parts = urlsplit(href)
    target = _resolve(site.root, page, parts.path) if parts.path else page
    if target is None:
        return href
    full = site.root / target
    if full.is_dir():
        readme = _readme_of(site.root, target)
        mapped = output_path(readme) if readme is not None else target / "index.html"
    elif target.suffix.lower() == ".md":
        mapped = output_path(target)
    else:
        mapped = target
    out = _rel(mapped, output_path(page).parent)
    return out + (f"#{parts.fragment}" if parts.fragment else "")


def check_links(site: Site) -> list[LinkProblem]:
    """Every relative link or image of every page whose target or ``#anchor`` does not exist."""
    problems: list[LinkProblem] = []
    root = site.root
    for source, page in site.pages.items():
        for link in page.rendered.links:
            if _is_external(link):
                continue
            parts = urlsplit(link)
            anchor = unquote(parts.fragment)
            if not parts.path:
                if anchor and anchor not in page.rendered.ids:
                    problems.append(
                        LinkProblem(str(source), link, f"no heading with id #{anchor} in this page")
                    )
                continue
            target = _resolve(root, source, parts.path)
            if target is None:
                problems.append(LinkProblem(str(source), link, "points outside the repository"))
                continue
            full = root / target
            if not full.exists():
                problems.append(LinkProblem(str(source), link, f"{target} does not exist"))
                continue
            if not anchor:
                continue
            if full.is_dir():
                readme = _readme_of(root, target)
                target = readme if readme is not None else target
            if target.suffix.lower() == ".md":
                linked = site.pages.get(target)
                if linked is None:
                    linked = Page(target, render_markdown(full.read_text(encoding="utf-8")))
                if anchor not in linked.rendered.ids:
                    problems.append(
                        LinkProblem(str(source), link, f"no heading with id #{anchor} in {target}")
                    )
            elif not re.fullmatch(r"L\d+(-L\d+)?", anchor):
                problems.append(LinkProblem(str(source), link, f"#{anchor} cannot be checked in {target}"))
    return problems


_CSS = """
:root { --fg:#1f2328; --muted:#59636e; --line:#d1d9e0; --code:#f6f8fa; --link:#0969da; }
* { box-sizing: border-box; }
body { margin:0; font:16px/1.55 -apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;
       color:var(--fg); display:flex; min-height:100vh; }
nav { width:250px; flex:none; border-right:1px solid var(--line); padding:24px 16px; font-size:14px;
      position:sticky; top:0; height:100vh; overflow:auto; }
nav a { display:block; padding:3px 8px; border-radius:6px; color:var(--fg); text-decoration:none; }
nav a.current, nav a:hover { background:var(--code); }
nav .brand { font-weight:600; font-size:16px; margin-bottom:12px; }
main { max-width:960px; padding:24px 40px 80px; min-width:0; flex:1; }
a { color:var(--link); }
h1,h2,h3,h4 { line-height:1.25; margin:1.6em 0 .6em; }
h1 { border-bottom:1px solid var(--line); padding-bottom:.3em; margin-top:.4em; }
h2 { border-bottom:1px solid var(--line); padding-bottom:.3em; }
a.anchor { margin-left:.4em; color:var(--muted); text-decoration:none; visibility:hidden; }
h1:hover a.anchor, h2:hover a.anchor, h3:hover a.anchor, h4:hover a.anchor { visibility:visible; }
code { background:var(--code); padding:.15em .35em; border-radius:4px; font-size:85%;
       font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; }
pre { background:var(--code); padding:14px 16px; border-radius:6px; overflow:auto; font-size:85%;
      line-height:1.45; }
pre code { background:none; padding:0; font-size:100%; }
pre.mermaid { background:none; text-align:center; }
div.table { overflow-x:auto; }
table { border-collapse:collapse; margin:1em 0; font-size:14px; }
th,td { border:1px solid var(--line); padding:6px 12px; vertical-align:top; }
th { background:var(--code); }
blockquote { margin:1em 0; padding:0 1em; color:var(--muted); border-left:4px solid var(--line); }
footer { color:var(--muted); font-size:13px; margin-top:48px; border-top:1px solid var(--line);
         padding-top:12px; }
@media (max-width: 800px) { body { display:block; } nav { position:static; width:auto; height:auto;
  border-right:none; border-bottom:1px solid var(--line); } main { padding:16px; } }
"""

_MERMAID = (
    '<script type="module">import mermaid from "https://cdn.jsdelivr.net/npm/mermaid@11/dist/mermaid.esm.min.mjs";'
    "mermaid.initialize({ startOnLoad: true });</script>"
)


def _nav_order(site: Site) -> list[PurePosixPath]:
    """Home, the docs index, the pages in the order the index links them, the rest, the changelog."""
    order: list[PurePosixPath] = []
    home, index = PurePosixPath("README.md"), PurePosixPath("docs/index.md")
    for fixed in (home, index):
        if fixed in site.pages:
            order.append(fixed)
    if index in site.pages:
        for link in site.pages[index].rendered.links:
            target = None if _is_external(link) else _resolve(site.root, index, urlsplit(link).path)
            if (
                target is not None
                and target in site.pages
                and target not in order
                and target.parent == index.parent
            ):
                order.append(target)
    order += sorted(p for p in site.pages if p.parent == index.parent and p not in order)
    changelog = PurePosixPath("CHANGELOG.md")
    if changelog in site.pages:
        order.append(changelog)
    return order


def _page_html(site: Site, page: Page, nav: list[PurePosixPath]) -> str:
    here = page.output.parent
    links = []
    for source in nav:
        target = site.pages[source]
        label = {"README.md": "Home", "docs/index.md": "Documentation", "CHANGELOG.md": "Changelog"}.get(
            str(source), target.rendered.title or source.stem
        )
        cls = ' class="current"' if source == page.source else ""
        links.append(f'<a{cls} href="{_rel(target.output, here)}">{html.escape(label)}</a>')
    title = page.rendered.title or page.source.stem
    brand = f'<a class="brand" href="{_rel(PurePosixPath("index.html"), here)}">agentlife</a>'
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)} · agentlife</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<nav>{brand}{''.join(links)}</nav>\n<main>\n{page.rendered.html}\n"
        f"<footer>Built from <code>{html.escape(str(page.source))}</code>.</footer>\n</main>\n"
        + (_MERMAID if page.rendered.has_mermaid else "")
        + "\n</body>\n</html>\n"
    )


def _listing_html(site: Site, directory: PurePosixPath) -> str:
    full = site.root / directory
    items = []
    for child in sorted(full.iterdir()):
        if child.name.startswith(".") or child.name in _SKIP_DIRS:
            continue
        rel = directory / child.name
        if child.is_dir():
            readme = _readme_of(site.root, rel)
            href = _rel(output_path(readme) if readme else rel / "index.html", directory)
            items.append(f'<li><a href="{href}">{html.escape(child.name)}/</a></li>')
            if readme is None:
                site.listings.add(rel)
        else:
            href = child.name if child.suffix.lower() != ".md" else _rel(output_path(rel), directory)
            if child.suffix.lower() != ".md":
                site.files.add(rel)
            items.append(f'<li><a href="{href}">{html.escape(child.name)}</a></li>')
    body = f"<h1>{html.escape(str(directory))}/</h1>\n<ul>{''.join(items)}</ul>"
    return _page_html(
        site, Page(directory / "index.md", Rendered(body, f"{directory}/", [], [])), _nav_order(site)
    )


def build(
    root: Path = REPO, out: Path | None = None, *, strict: bool = False, check_only: bool = False
) -> int:
    """Check the links and (unless ``check_only``) write the site; returns the exit status."""
    site = collect_pages(root)
    problems = check_links(site)
    for problem in problems:
        sys.stderr.write(("error: " if strict else "warning: ") + f"{problem}\n")
    if strict and problems:
        sys.stderr.write(f"{len(problems)} broken link(s); the site was not written\n")
        return 1
    if check_only:
        sys.stdout.write(
            f"{len(site.pages)} pages, {sum(len(p.rendered.links) for p in site.pages.values())} "
            f"links: {'ok' if not problems else f'{len(problems)} broken'}\n"
        )
        return 0
    out = out or root / "site"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    nav = _nav_order(site)
    for page in site.pages.values():
        _write(out / page.output, _page_html(site, page, nav))
    done: set[PurePosixPath] = set()
    while site.listings - done:  # a listing can discover sub-directories that need one too
        for directory in sorted(site.listings - done):
            done.add(directory)
            _write(out / directory / "index.html", _listing_html(site, directory))
    for rel in sorted(site.files):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, out / rel)
    sys.stdout.write(f"site written to {out}: {len(site.pages)} pages, {len(site.files)} files\n")
    return 0


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def main(argv: Iterable[str] | None = None) -> int:
    """Command line: ``python docs/build.py [--strict] [--out DIR] [--root DIR] [--check-only]``."""
    parser = argparse.ArgumentParser(description="Build docs/ into a static site and check its links.")
    parser.add_argument("--strict", action="store_true", help="exit 1 on any broken relative link or anchor")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: ROOT/site)")
    parser.add_argument("--root", type=Path, default=REPO, help="repository root (default: this checkout)")
    parser.add_argument("--check-only", action="store_true", help="check the links, write nothing")
    args = parser.parse_args(list(argv) if argv is not None else None)
    return build(args.root.resolve(), args.out, strict=args.strict, check_only=args.check_only)


if __name__ == "__main__":
    sys.exit(main())
