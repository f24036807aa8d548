"""The README is the door: short, every link inside the repository and resolving (files and anchors), and
every page of docs/ reachable from it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)|\!\[[^\]]*\]\(([^)\s]+)\)")
README_MAX_BYTES = 15_000


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"(?s)```.*?```", "", path.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"(?m)^#+ (.+)$", text)}


def _links(path: Path) -> list[str]:
    text = re.sub(r"(?s)```.*?```", "", path.read_text())
    return [a or b for a, b in LINK.findall(text)]


def test_readme_is_short():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; the door stays under {README_MAX_BYTES} (move details to docs/)"


def test_every_link_stays_in_the_repository_and_resolves():
    problems = []
    for page in [README, *DOCS]:
        for link in _links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", link):
                problems.append(f"{page.name}: {link} leaves the repository")
                continue
            target, _, anchor = link.partition("#")
            file = (page.parent / target).resolve() if target else page
            if not file.is_relative_to(ROOT):
                problems.append(f"{page.name}: {link} points outside the repository")
            elif not file.exists():
                problems.append(f"{page.name}: {link} does not exist")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                problems.append(f"{page.name}: {link}: no heading #{anchor} in {file.name}")
    assert not problems, "\n".join(problems)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / link.partition("#")[0]).resolve() for link in _links(README)}
    unlinked = [p.name for p in DOCS if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"
