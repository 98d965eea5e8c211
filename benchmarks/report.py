"""The shared results file: every benchmark owns one `## ` section of docs/benchmarks.md and
replaces only that section, so running one benchmark never erases another's results."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def write_section(path: Path, heading: str, section: str) -> None:
    """Replace the section that starts with the line `heading` (or append it), keeping the others.

    `section` is the whole section text, starting with `heading`.
    """
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") == heading), None)
    if start is None:
        path.write_text(text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n")
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    path.write_text("".join(lines[:start]) + section.rstrip("\n") + "\n" + ("\n" + tail if tail else ""))
