"""The repository's docs are the only ones it cites, and what they point at exists.

* No tracked file names the team's working notes (files outside the repository a user cannot open).
* Every `docs/NAME.md` or `dev/NAME.md` a tracked file names exists, and a cited section
  (`docs/METHOD.md, "Stages and schedules"`, `README, GPU install`) is a heading of that page.
* Every relative Markdown link resolves to a file, and a `#anchor` to a heading of its target.
* Every command and repository path the user's guides show (README.md, docs/, recipes/**/README.md) exists.
* README.md stays a user's guide (at most about 15 KB); measurements and history live in docs/ (the development
  log and proposals in dev/).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(REPO).as_posix()

# The team's notes: not in the repository, so no tracked file may send a user to them.
NOTES = re.compile(
    r"DESIGN\.md|MLMT_SPEC|VERL_ON_CPU|VLLM_ON_CPU|STYLE\.md|ASSETS\.md|GPU_INSTALL\.md|SLURM_LOCAL\.md"
    r"|shared/docs|shared/seeds"
)
TEXT_SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".txt", ".toml", ".cfg", ".sbatch", ""}
GUIDES = ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))]
GUIDES += sorted(p.relative_to(REPO).as_posix() for p in (REPO / "recipes").rglob("README.md"))
TOP_DIRS = ("agent_system", "mlmt-configs", "recipes", "scripts", "tests", "docs", "dev", "examples", "benchmarks",
            "requirements", "verl")  # fmt: skip


def _tracked_text_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    files = []
    for name in out.splitlines():
        path = REPO / name
        if path.suffix in TEXT_SUFFIXES and path.is_file() and name != THIS:
            try:
                path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            files.append(name)
    return files


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _headings(page: Path) -> list[str]:
    lines, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            lines.append(line.lstrip("#").strip())
    return lines


@pytest.mark.external
def test_no_tracked_file_cites_the_team_notes():
    hits = []
    for name in _tracked_text_files():
        for number, line in enumerate((REPO / name).read_text(encoding="utf-8").splitlines(), 1):
            if NOTES.search(line):
                hits.append(f"{name}:{number}: {line.strip()[:100]}")
    assert not hits, "files outside the repository are cited (cite docs/ instead):\n" + "\n".join(hits)


@pytest.mark.external
def test_every_cited_doc_and_section_exists():
    missing = []
    for name in _tracked_text_files():
        # a citation may wrap over comment lines: join them ("# ", "  ", docstring indentation)
        text = re.sub(r"\s*\n\s*(?:#+ ?)?\s*", " ", (REPO / name).read_text(encoding="utf-8"))
        for doc in set(re.findall(r"\b((?:docs|dev)/[A-Z][A-Z_]*\.md)", text)):
            if not (REPO / doc).is_file():
                missing.append(f"{name}: {doc} does not exist")
        for doc, section in re.findall(r"\b((?:docs|dev)/[A-Z][A-Z_]*\.md),?\s+\"([^\"]+)\"", text):
            page = REPO / doc
            if page.is_file() and section not in _headings(page):
                missing.append(f'{name}: {doc} has no section "{section}"')
        # README sections named in messages and comments: README.md, 'Troubleshooting' / (README, GPU install: ...)
        cited = re.findall(r"README(?:\.md)?,\s+[\"']([^\"']+)[\"']", text)
        cited += re.findall(r"\(README, ([A-Z][\w -]+?)[):]", text)
        missing += [f"{name}: README.md has no section {s!r}" for s in cited if s not in _headings(REPO / "README.md")]
    assert not missing, "\n".join(missing)


@pytest.mark.external
def test_markdown_links_resolve():
    broken = []
    for name in _tracked_text_files():
        if not name.endswith(".md"):
            continue
        page = REPO / name
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            linked = (page.parent / path_part).resolve() if path_part else page
            if not linked.exists():
                broken.append(f"{name}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in {_slug(h) for h in _headings(linked)}:
                broken.append(f"{name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def _shown_paths(text: str) -> set[str]:
    """Repository paths a guide shows: `bash X.sh`, `python -m M` (as a file) and backquoted paths."""
    paths = set(re.findall(r"\bbash\s+((?:[\w.-]+/)+[\w.-]+\.sh)\b", text))  # a path, not EXPERIMENT.sh
    for module in re.findall(r"python -m ((?:agent_system|verl)(?:\.\w+)+)", text):
        paths.add(module.replace(".", "/") + ".py")
    for quoted in re.findall(r"`([^`\s]+)`", text):
        if quoted.split("/")[0] in TOP_DIRS and "/" in quoted and not re.search(r"[{}<>*$]|\bN\b|_N\b|\.\.\.", quoted):
            paths.add(quoted.split(":")[0].rstrip("/"))
    return paths


@pytest.mark.parametrize("guide", GUIDES)
def test_commands_and_paths_a_guide_shows_exist(guide):
    text = (REPO / guide).read_text(encoding="utf-8")
    missing = sorted(p for p in _shown_paths(text) if not (REPO / p).exists())
    assert not missing, f"{guide} shows paths the repository lacks: {missing}"


def test_readme_is_a_users_guide():
    size = len((REPO / "README.md").read_bytes())
    assert size <= 16_000, f"README.md is {size} bytes: move measurements, history and references to docs/"
    headings = _headings(REPO / "README.md")
    for section in ("Install", "Running", "Evaluate", "Slurm", "Tests", "Where to read more"):
        assert section in headings, f"README.md lost its '{section}' section"


@pytest.mark.external  # git ls-files
def test_entry_points_page_lists_every_entry_point_and_launcher():
    """docs/ENTRY_POINTS.md is the one map: every module with a ``__main__`` block (but the sandbox's two stages, which
    the sandbox runs as ``python -c``), every ``python -m`` module a tracked file shows, and every launcher script."""
    page = (REPO / "docs" / "ENTRY_POINTS.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"`python -m ((?:agent_system|verl)(?:\.\w+)+)`", page))
    mains = {
        path.relative_to(REPO).with_suffix("").as_posix().replace("/", ".")
        for top in ("agent_system", "verl")
        for path in (REPO / top).rglob("*.py")
        if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")
    } - {"agent_system.rewards.sandbox_harness", "agent_system.rewards.sandbox_isolation"}
    module = re.compile(r"python -m ((?:agent_system|verl)(?:\.\w+)+)(?![.\w])")  # not a name cut by a line end
    shown = {m for name in _tracked_text_files() for m in module.findall((REPO / name).read_text(encoding="utf-8"))}
    missing = sorted((mains | shown) - listed)
    assert len(mains) >= 13 and not missing, f"not in docs/ENTRY_POINTS.md: {missing}"
    launchers = [p.relative_to(REPO).as_posix() for p in (REPO / "scripts").glob("*.sh")]
    launchers += [p.relative_to(REPO).as_posix() for p in (REPO / "examples").rglob("*.sh")]
    launchers += ["recipes/compare.sh", "mlmt-configs/submit_mlmt.sbatch", "mlmt-configs/math/eval_math500.sh"]
    launchers += ["mlmt-configs/submit_eval.sbatch", "recipes/submit_compare.sbatch"]
    missing = [p for p in launchers if p not in page]
    assert not missing, f"launchers missing from docs/ENTRY_POINTS.md: {missing}"
