"""Writing a benchmark's figures into docs/benchmarks.md, between markers of its own."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def write_section(name: str, body: str) -> None:
    """Replace the section between <!-- name:start --> and <!-- name:end -->, or append it."""
    start_mark, end_mark = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    section = f"{start_mark}\n{body.strip()}\n{end_mark}"
    text = BENCHMARKS.read_text() if BENCHMARKS.exists() else "# Benchmarks\n"
    if start_mark in text:
        start, end = text.index(start_mark), text.index(end_mark) + len(end_mark)
        text = text[:start] + section + text[end:]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    BENCHMARKS.write_text(text)
