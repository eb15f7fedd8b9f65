"""Every relative link of the README and of each page under docs/ reaches a file and, with
an anchor, one of that file's headings, so a section renamed or moved to another page fails
the suite instead of leaving links that point nowhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.links import broken_links, heading_anchors

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_reaches_a_file_and_heading(page: Path) -> None:
    assert broken_links(page) == []


def test_a_link_to_a_missing_heading_or_file_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text(
        "# Other\n\n## A section's title\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-sections-title) [own](#page) [gone](other.md#gone) "
                    "[fenced](other.md#not-a-heading) [none](missing.md)\n# Page\n")
    assert broken_links(page) == [
        "other.md#gone: no such heading in other.md",
        "other.md#not-a-heading: no such heading in other.md",
        "missing.md: no such file",
    ]
    assert heading_anchors((tmp_path / "other.md").read_text()) == {"other", "a-sections-title"}
