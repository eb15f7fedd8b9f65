"""The relative links of a Markdown page and the anchors GitHub gives a page's headings, so
that a test can check that each link reaches a file and, with an anchor, one of its
headings."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.snippets import FENCE

LINK = re.compile(r"\]\(([^)\s]+)\)")
"""The target of an inline Markdown link, ``[text](target)``."""


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings (outside fenced blocks): lower case,
    punctuation dropped, spaces as hyphens."""
    anchors = set()
    fenced = False
    for line in markdown.splitlines():
        if line.startswith(FENCE):
            fenced = not fenced
        elif not fenced and line.startswith("#") and (title := line.lstrip("#")).startswith(" "):
            anchors.add(re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-"))
    return anchors


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` that names no file, or an anchor that is none of that
    file's headings (a bare ``#anchor`` is one of ``page``'s own), with the reason."""
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        linked = page.parent / path if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(
                linked.read_text(encoding="utf-8")):
            broken.append(f"{target}: no such heading in {linked.name}")
    return broken
