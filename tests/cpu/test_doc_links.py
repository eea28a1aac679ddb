"""CPU tier: every relative link in the README, the docs and the examples' READMEs names a file or
folder of the repository (reports leave docs/perf as newer ones replace them)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")
EXTERNAL = ("http://", "https://", "mailto:", "#")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]


def test_relative_links_resolve():
    broken = []
    for md in markdown_files():
        for target in LINK.findall(md.read_text()):
            if target.startswith(EXTERNAL):
                continue
            if not (md.parent / target.split("#")[0]).exists():
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)
