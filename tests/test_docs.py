"""The repository's own docs point at files that exist: after a move, a stale link fails here."""

from __future__ import annotations

import re
import subprocess
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


OUTSIDE_DOCS = ("ENVIRONMENT" + ".md", "DESIGN" + ".md", "STYLE" + ".md")  # split so this file passes its own check


def test_no_file_points_at_notes_outside_the_repository():
    """Code and docs state their facts, or point at docs/ and the README; a reader who clones the
    repository has nothing else."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    tracked = [ROOT / name for name in listed.splitlines()
               if Path(name).suffix in {".py", ".md", ".yaml", ".yml", ".js", ".toml", ".txt", ".sh", ".ini", ".cfg"}
               or name in ("Makefile", ".ci/run")]
    offenders = sorted(str(p.relative_to(ROOT)) for p in tracked
                       if any(name in p.read_text(encoding="utf-8", errors="ignore") for name in OUTSIDE_DOCS))
    assert offenders == []


def test_every_module_path_in_the_architecture_doc_exists():
    """The concept → module table names real files and folders, so a move that forgets the doc fails."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    paths = {p for p in re.findall(r"`((?:api|service|workers|algorithms|cli|bench|deploy|tests)/[\w./]*)`", text)
             if "<" not in p and "{" not in p}
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert missing == []
