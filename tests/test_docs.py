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
    page.write_text("# Title\n## 4. The credit-assignment study (`python studies/credit_study.py`)\n```\n# not a heading\n```\n")
    assert anchors(page) == {"title", "4-the-credit-assignment-study-python-studiescredit_studypy"}


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


# A clone stands alone: no file of the repository reads or cites a path beside it. The patterns are
# built from pieces so that this file does not match itself.
SHARED = "shar" + "ed"
OUTSIDE = re.compile("|".join([re.escape("../" + SHARED), rf"\b{SHARED}/(?:specs|seeds|data)\b",
                               re.escape("parents[" + "2]"), re.escape("parent." * 2 + "parent"),
                               re.escape(f'parent.parent / "{SHARED}"')]))
SKIPPED = {".git", ".venv", "runs", ".cache", "__pycache__", ".pytest_cache", "mutants", "checkpoints"}
TEXT = {".py", ".md", ".txt", ".cfg", ".sh", ".toml", ".ini", ""}


def repository_text_files() -> list[Path]:
    files = []
    for path in sorted(REPO.rglob("*")):
        parts = path.relative_to(REPO).parts
        if path.is_file() and not SKIPPED & set(parts) and path.suffix in TEXT and "figures" not in parts:
            files.append(path)
    return files


def test_no_file_reads_or_cites_a_path_beside_the_repository():
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()[:120]}" for path in repository_text_files()
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert not found, "\n".join(found)
    assert REPO / ".ci" / "run" in repository_text_files() and REPO / "data.py" in repository_text_files()


def test_the_outside_pattern_by_hand():
    for line in [f"see ../{SHARED}/data/SOURCES.md", "DATA = Path(__file__).parents[" + "2] / 'x'",
                 f"read {SHARED}/specs/PASS.md", "REPO." + "parent." * 2 + "parent"]:
        assert OUTSIDE.search(line), line
    for line in ["the statistics shared by every study", "Path(__file__).resolve().parents[1]",
                 "REPO = Path(__file__).resolve().parent.parent  # tests/ -> the repository"]:
        assert not OUTSIDE.search(line), line


def test_no_shipped_record_names_a_machines_folder():
    """The JSON the docs quote (docs/figures/) records paths relative to the repository (runlog.portable)."""
    absolute = re.compile(r'"/(?:work|home|root|tmp|Users|mnt|data|opt|srv|scratch)/')
    found = [str(p.relative_to(REPO)) for p in sorted((REPO / "docs" / "figures").rglob("*.json"))
             if absolute.search(p.read_text())]
    assert not found, found


def test_a_record_keeps_a_path_inside_the_repository_relative_one_elsewhere_by_its_name_and_a_hub_name():
    import runlog
    assert runlog.portable(REPO / ".cache" / "smollm2") == ".cache/smollm2"
    assert runlog.portable("/scratch/runs/sums2-validation.jsonl") == "sums2-validation.jsonl"
    assert runlog.portable("Qwen/Qwen2.5-Math-7B") == "Qwen/Qwen2.5-Math-7B" and runlog.portable("") == ""


def import_graph() -> dict[str, set[str]]:
    """Which of the repository's modules (the root's and studies/') each one imports, anywhere in it."""
    import ast

    modules = {p.stem: p for p in [*REPO.glob("*.py"), *(REPO / "studies").glob("*.py")]}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
        graph[name] = found & set(modules) - {name}
    return graph


def test_imports_point_one_way():
    """No module imports one that imports it back, directly or through others; no module of the system
    (the root) imports a study (studies/), and studies/stats.py and studies/runner.py import no study."""
    graph = import_graph()
    studies = {p.stem for p in (REPO / "studies").glob("*.py")}
    assert {"reproduce", "real_study", "credit_study", "stats", "runner", "train", "prime"} <= set(graph)

    def reaches(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    circles = sorted(name for name in graph if name in reaches(name))
    assert not circles, f"import circles through {circles}"
    assert not {name: graph[name] & studies for name in set(graph) - studies if graph[name] & studies}
    assert not (graph["stats"] | graph["runner"]) & {"reproduce", "real_study", "credit_study"}
