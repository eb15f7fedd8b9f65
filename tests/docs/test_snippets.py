"""The marked blocks of a Markdown page (tests/docs/snippets.py): what is read from a page,
and the pages it refuses."""

from __future__ import annotations

import pytest

from tests.docs.snippets import console_parts, expected_lines_found, marked_blocks, python_printed

PAGE = """# A page

<!-- test: toml a.toml from=base.toml -->
```toml
x = 1
```

Text between blocks.

<!-- test: shell on=main -->
```console
$ echo one \\
    two
one two
$ true
```
"""


def test_blocks_are_read_with_their_markers_in_order() -> None:
    toml, shell = marked_blocks(PAGE)
    assert (toml.line, toml.lang, toml.kind, toml.words, toml.options, toml.text) == (
        4, "toml", "toml", ("a.toml",), {"from": "base.toml"}, "x = 1\n")
    assert (shell.kind, shell.options, shell.name) == ("shell", {"on": "main"}, "L11-shell")


@pytest.mark.parametrize(("page", "line", "says"), [
    ("```bash\nls\n```\n", 1, "without a '<!-- test: ... -->' marker"),
    ("<!-- test: shell -->\n\n```bash\nls\n```\n", 1, "not on the line before"),
    ("<!-- test: shell -->\ntext\n", 1, "not on the line before a block"),
    ("<!-- test: shell -->\n", 1, "without a block after it"),
    ("<!-- test: shell -->\n```bash\nls\n", 2, "never closed"),
])
def test_a_block_without_its_marker_is_refused_naming_the_line(page: str, line: int,
                                                               says: str) -> None:
    with pytest.raises(ValueError, match=f"^line {line}: .*{says}"):
        marked_blocks(page)


def test_a_console_block_splits_into_commands_and_what_they_print() -> None:
    _, shell = marked_blocks(PAGE)
    assert console_parts(shell.text) == ("echo one \\\n    two\ntrue\n", "one two\n")


def test_python_blocks_show_what_they_print_on_their_own_lines() -> None:
    code = 'print(1)\n#> 1\nx = 2  # not printed\n  #> two words\n'
    assert python_printed(code) == "1\ntwo words\n"


def test_expected_lines_are_found_in_order_with_a_wildcard() -> None:
    out = "header\nrequests 99 over 59.8 s; goodput 1.0000\nend\n"
    assert expected_lines_found("requests 99 over … goodput 1.0000\nend", out) == []
    assert expected_lines_found("end\nheader", out) == ["header"]
    assert expected_lines_found("requests 98 over …", out) == ["requests 98 over …"]
