"""The fenced blocks of a Markdown page, each with the instruction that says how the suite
runs it.

A block is marked by an HTML comment on the line before its opening fence (a reader of
the rendered page does not see it)::

    <!-- test: KIND [WORD ...] [key=value ...] -->

Every fenced block of a page read here carries one, so a snippet cannot be added without
saying how it is checked; ``skip REASON`` marks one that is shown and not run. Fences are
top-level triple backticks; a fence inside a block does not open another.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

FENCE = "```"
MARKER = re.compile(r"^<!--\s*test:\s*(?P<body>.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    """One fenced block and its marker."""

    line: int
    """1-based line of the opening fence."""
    lang: str
    """The fence's info string (``toml``, ``bash``, ``python``, ...)."""
    kind: str
    """The marker's first word."""
    words: tuple[str, ...]
    """The marker's other words, in order."""
    options: dict[str, str] = field(default_factory=dict)
    """The marker's ``key=value`` pairs."""
    text: str = ""
    """The block's content, without the fences; ends with a newline unless empty."""

    @property
    def name(self) -> str:
        """A short id for test names: line, kind and first word."""
        first = self.words[0] if self.words else ""
        return f"L{self.line}-{self.kind}" + (f"-{first}" if first else "")


def marked_blocks(markdown: str) -> list[Block]:
    """Every fenced block of ``markdown`` in order; ``ValueError`` naming the line of a
    block without a marker, of a marker without a block, or of a fence left open."""
    lines = markdown.splitlines()
    blocks: list[Block] = []
    marker: tuple[int, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        found = MARKER.match(line.strip())
        if found:
            if marker is not None:
                raise ValueError(f"line {marker[0]}: a test marker without a block after it")
            marker = (i + 1, found.group("body"))
        elif line.startswith(FENCE):
            if marker is None:
                raise ValueError(f"line {i + 1}: a fenced block without a "
                                 f"'<!-- test: ... -->' marker on the line before it")
            if marker[0] != i:
                raise ValueError(f"line {marker[0]}: the marker is not on the line before "
                                 f"its block (line {i + 1})")
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == FENCE),
                       None)
            if end is None:
                raise ValueError(f"line {i + 1}: the fenced block is never closed")
            body = "\n".join(lines[i + 1:end])
            blocks.append(_block(i + 1, line[len(FENCE):].strip(), marker[1],
                                 body + "\n" if body else ""))
            marker = None
            i = end
        elif marker is not None and line.strip():
            raise ValueError(f"line {marker[0]}: the marker is not on the line before a "
                             f"block")
        i += 1
    if marker is not None:
        raise ValueError(f"line {marker[0]}: a test marker without a block after it")
    return blocks


def _block(line: int, lang: str, marker: str, text: str) -> Block:
    parts = marker.split()
    if not parts:
        raise ValueError(f"line {line - 1}: an empty test marker")
    kind, rest = parts[0], parts[1:]
    words = tuple(p for p in rest if "=" not in p)
    options = dict(p.split("=", 1) for p in rest if "=" in p)
    return Block(line=line, lang=lang, kind=kind, words=words, options=options, text=text)


def expected_lines_found(expected: str, output: str) -> list[str]:
    """The lines of ``expected`` (blank ones left out) that ``output`` lacks: each must be
    found in a line of ``output``, in order, where ``…`` stands for any text."""
    out_lines = output.splitlines()
    missing: list[str] = []
    at = 0
    for want in (ln.strip() for ln in expected.splitlines()):
        if not want:
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in want.split("…")))
        hit = next((j for j in range(at, len(out_lines)) if pattern.search(out_lines[j])),
                   None)
        if hit is None:
            missing.append(want)
        else:
            at = hit + 1
    return missing


def console_parts(text: str) -> tuple[str, str]:
    """A ``console`` block split into its commands (the lines after ``$ `` and the lines a
    trailing backslash continues) and what it shows them printing (every other line)."""
    commands: list[str] = []
    printed: list[str] = []
    continued = False
    for line in text.splitlines():
        if continued:
            commands.append(line)
        elif line.startswith("$ "):
            commands.append(line[2:])
        else:
            printed.append(line)
            continue
        continued = line.endswith("\\")
    return "\n".join(commands) + "\n", "\n".join(printed) + ("\n" if printed else "")


PRINTED_PREFIX = "#>"
"""A line of a Python block that starts with this shows what the block prints."""


def python_printed(text: str) -> str:
    """What a Python block shows itself printing: its ``#>`` lines, without the prefix."""
    lines = [ln.strip()[len(PRINTED_PREFIX):].strip() for ln in text.splitlines()
             if ln.strip().startswith(PRINTED_PREFIX)]
    return "\n".join(lines) + ("\n" if lines else "")
