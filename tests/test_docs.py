"""The repository's own docs: links point at files and headings that exist (after a move, a stale link
fails here), and the README's RunSpec reference is a spec the service accepts."""

from __future__ import annotations

import functools
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


# [text](target#anchor) or [text](#anchor): the anchor of a heading in a Markdown file.
ANCHORED_LINK = re.compile(r"\]\((?!https?://|mailto:)([^)\s#]*)#([^)\s]+)\)")


@functools.cache  # a page is read once, however many links point into it
def heading_anchors(doc: Path) -> set[str]:
    """The anchors GitHub gives ``doc``'s headings: lower case, punctuation but ``-`` and ``_``
    dropped, spaces as ``-``, a repeated anchor suffixed ``-1``, ``-2``, ... (a suffixed one is
    taken too); a closing run of ``#`` is not part of the title, and lines inside fenced code
    (``` or ~~~) are not headings."""
    text = re.sub(r"^ {0,3}(```|~~~).*?^ {0,3}\1", "", doc.read_text(encoding="utf-8"), flags=re.S | re.M)
    anchors: set[str] = set()
    for title in re.findall(r"^ {0,3}#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$", text, flags=re.M):
        anchor = base = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        repeat = 0
        while anchor in anchors:
            repeat += 1
            anchor = f"{base}-{repeat}"
        anchors.add(anchor)
    return anchors


def test_heading_anchors_follow_githubs_rules(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# Tessera\n## The API (`/api/v1`, docs)\n## Logs\n```yaml\n# not a heading\n```\n## Logs\n"
                   "## Logs 1\n~~~\n# nor this\n~~~\n### Ray's job list ##\n  ## Indented\n", encoding="utf-8")
    assert heading_anchors(doc) == {"tessera", "the-api-apiv1-docs", "logs", "logs-1", "logs-1-1", "rays-job-list",
                                    "indented"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_to_a_heading_name_a_heading_that_exists(doc):
    """A section renamed or moved to another page fails here, not in a reader's browser."""
    broken = sorted(f"{target}#{anchor}" for target, anchor in ANCHORED_LINK.findall(doc.read_text(encoding="utf-8"))
                    if (linked := doc.parent / target if target else doc).suffix == ".md" and linked.exists()
                    and anchor not in heading_anchors(linked))
    assert broken == [], f"{doc.relative_to(ROOT)} links to missing headings: {broken}"


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


def test_the_readme_runspec_reference_is_a_valid_spec():
    """The README's annotated RunSpec names every field a user can set; it must stay a spec the
    service accepts (a renamed or removed field fails here)."""
    import yaml

    from api.specs import RunSpec

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## RunSpec reference", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    spec = RunSpec.model_validate(yaml.safe_load(block))
    assert spec.data.eval_batch_size == 256 and spec.optimizer.nesterov is False
    # The commented alternative optimizer is a valid one too.
    adamw = next(line for line in block.splitlines() if line.startswith("# or: {name: adamw"))
    spec = RunSpec.model_validate({**yaml.safe_load(block), "optimizer": yaml.safe_load(adamw.removeprefix("# or: "))})
    assert spec.optimizer.betas == (0.9, 0.999)


def _cli_commands():
    """``(path, command)`` of every ``tessera`` command: ``("sweeps", "wait")``, ``("runs",)``."""
    from typer.main import get_command

    from cli.main import app

    def walk(command, path):
        for name, sub in getattr(command, "commands", {}).items():
            if getattr(sub, "commands", None):
                yield from walk(sub, (*path, name))
            else:
                yield (*path, name), sub

    return list(walk(get_command(app), ()))


def test_the_readme_shows_every_command_of_the_cli_groups():
    """``tessera sweeps wait`` was missing from the README's sweeps commands."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = sorted(" ".join(path) for path, _ in _cli_commands() if len(path) > 1
                     and f"tessera {' '.join(path)}" not in readme)
    assert missing == []


def test_the_readme_names_every_command_that_takes_json_and_what_a_list_prints():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    bullet = " ".join(readme.split("- `--json` on the read commands", 1)[1].split("\n- ", 1)[0].split())
    taking = sorted(" ".join(path) for path, command in _cli_commands()
                    if any("--json" in getattr(param, "opts", []) for param in command.params))
    assert len(taking) > 15 and [name for name in taking if f"`{name}`" not in bullet] == []
    # A list command prints the API's data as a JSON array (runs, sweeps list, checkpoints alike), not the page.
    assert "for a list command a JSON array of them (the API's `data`, without the page around it" in bullet
