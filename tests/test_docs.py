"""The front page and docs/ are read on GitHub: every relative link and image in README.md and docs/*.md
must point at a file of this repository, and a link to a section (`page.md#section`, `#section`) at a
heading that page has, by GitHub's rule for heading anchors."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but '-' and '_' dropped, spaces as '-'."""
    text = FENCE.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def test_github_anchor_rule_by_hand(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Title\n## 4. The credit-assignment study (`python credit_study.py`)\n```\n# not a heading\n```\n")
    assert anchors(page) == {"title", "4-the-credit-assignment-study-python-credit_studypy"}


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_and_image_resolves(page):
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...: not this repository's
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or REPO not in file.parents:
            broken.append(f"{target}: no such file in the repository")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: {file.name} has no heading with that anchor")
    assert not broken, broken
    assert len(PAGES) >= 8  # the front page and one page per topic
