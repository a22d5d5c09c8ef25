"""Every relative link and image in README.md and docs/**/*.md resolves: the file exists and, for a
``#anchor``, a heading of that page makes that anchor (GitHub's rule: lower case, punctuation
dropped, spaces to hyphens).  Links to other sites are not fetched."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def _pages() -> list[Path]:
    """README.md and every docs page; drafts waiting in docs/_pending/ are checked once folded in."""
    return [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md") if "_pending" not in p.parts)


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in _prose(page.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")  # drops the backticks too
            n, s = 1, slug
            while s in found:
                s, n = f"{slug}-{n}", n + 1
            found.add(s)
    return found


def links(page: Path) -> list[str]:
    """Link targets in prose (a ``[x](y)`` inside inline code is no link)."""
    return [m.group(1) for line in _prose(page.read_text()) for m in LINK.finditer(re.sub(r"`[^`]*`", "", line))]


def broken(page: Path) -> list[str]:
    bad = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading makes #{anchor})")
    return bad


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert not broken(page), broken(page)


def test_the_checker_sees_a_broken_link_and_a_bad_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title here\n\n## The `/x` route\n\n[ok](a.md#title-here) [gone](b.md) "
                                   "[x](a.md#nope) [r](#the-x-route)\n"
                                   "![pic](missing.png) `[in code](c.md)`\n```\n[fenced](d.md)\n```\n")
    assert broken(tmp_path / "a.md") == ["b.md (no such file)", "a.md#nope (no heading makes #nope)",
                                         "missing.png (no such file)"]


def test_every_docs_page_is_reachable_from_the_readme():
    """A page nobody links to is a page nobody reads: the README or the docs index names each."""
    named = {(ROOT / "README.md").parent.joinpath(t.partition("#")[0]).resolve()
             for t in links(ROOT / "README.md")}
    index = ROOT / "docs" / "README.md"
    named |= {index.parent.joinpath(t.partition("#")[0]).resolve() for t in links(index)}
    pages = [p for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"]
    assert pages and not [p.name for p in pages if p.resolve() not in named]
