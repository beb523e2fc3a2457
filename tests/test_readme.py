"""The README quotes only what was measured: every speed-up of its headline table is found in a committed result
file under results/, and every link into docs/ resolves."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _headline_rows() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Headline results", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and re.search(r"\d\.\d+x", line)]


def test_every_headline_speedup_is_in_a_committed_result():
    rows = _headline_rows()
    assert len(rows) >= 4
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        speedup, where = cells[3], cells[-1]
        assert re.fullmatch(r"\d+\.\d+x", speedup), row
        assert cells[4], f"no quality tier said for {row}"
        folder = ROOT / where
        assert folder.is_dir(), f"{where} is not a results folder"
        number = re.escape(speedup[:-1])
        # said as such in a write-up, or a measured speed-up field that rounds to it in a raw file
        pattern = re.compile(rf"(?<![\d.]){number}x|\"speedup\": {number}\d*")
        found = any(pattern.search(p.read_text(errors="ignore"))
                    for p in folder.rglob("*") if p.is_file() and p.suffix in (".md", ".json", ".log") and
                    p.stat().st_size < 5_000_000)
        assert found, f"{speedup} ({cells[2]}) is not in any file under {where}"


def test_links_into_docs_resolve():
    text = (ROOT / "README.md").read_text()
    for ref in set(re.findall(r"\b(docs/[\w./-]+\.md)", text)):
        assert (ROOT / ref).is_file(), ref
    for path in (ROOT / "docs").glob("*.md"):
        for ref in set(re.findall(r"\b(docs/[\w-]+\.md)", path.read_text())):
            assert (ROOT / ref).is_file(), f"{path.name} links {ref}"
