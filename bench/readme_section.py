"""Rewrite one generated section of a README from a benchmark's results, so that the README never
holds hand-typed numbers. A section is the text between the markers `<!-- results:NAME:start -->`
and `<!-- results:NAME:end -->`, which must already be in the file."""

from __future__ import annotations

import os
from pathlib import Path


def update_readme(readme: Path, name: str, text: str) -> None:
    start, end = f"<!-- results:{name}:start -->", f"<!-- results:{name}:end -->"
    content = readme.read_text()
    if start not in content or end not in content:
        raise SystemExit(f"error: {readme} has no {start} ... {end} section")
    head, rest = content.split(start, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{start}\n{text}\n{end}{tail}")


def relative_link(target: Path, readme: Path) -> str:
    """`target` as a link relative to the README's folder."""
    return os.path.relpath(Path(target).resolve(), Path(readme).resolve().parent)
