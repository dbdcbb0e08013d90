"""The repository's own docs point at files that exist: after a move, a stale link fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# [text](target) with a relative target; anchors and query strings are not files.
LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_in_the_repository(doc):
    targets = {match.split("#")[0] for match in LINK.findall(doc.read_text(encoding="utf-8"))}
    missing = sorted(t for t in targets if t and not (doc.parent / t).exists())
    assert missing == [], f"{doc.relative_to(ROOT)} links to missing files: {missing}"


def test_the_readme_links_every_algorithms_method_card():
    from api import catalog

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unlinked = sorted(name for name in catalog.ALGORITHMS if f"](api/method_cards/{name}.md)" not in readme)
    assert unlinked == []
