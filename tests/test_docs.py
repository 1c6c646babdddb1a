"""The README and docs stay a user's: short, no run ids, hashes or machine paths, a reference that matches the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli import _COMMANDS, _parser
from autotune.recipes import shipped_files
from tools import reference

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 250

RUN_ID = re.compile(r"\bs\d{2}[a-z]?\b")
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
MACHINE_PATH = re.compile(r"(?<![\w.])(/work/|/home/|/Users/|/root/|/tmp/|[A-Z]:\\\\)")


def violations(text: str) -> list[str]:
    """Each run id, commit hash or developer-machine path in `text`, as 'line N: what'."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for what, pattern in (("run id", RUN_ID), ("commit hash", COMMIT), ("machine path", MACHINE_PATH)):
            found += [f"line {n}: {what} {m.group(0)!r}" for m in pattern.finditer(line)]
    return found


def user_pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; keep it to {MAX_README_LINES} (details go in docs/)"


@pytest.mark.parametrize("page", user_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_name_no_run_hash_or_machine_path(page):
    assert violations(page.read_text()) == []


def test_the_check_catches_planted_violations():
    planted = "measured in s37b at commit c9653d2, see /work/bench.json\nfine: s3, 1e-5, deadbeef, cafe, 2026-12-07"
    assert [v.split(":")[0] for v in violations(planted)] == ["line 1"] * 3


def test_docs_hold_no_raw_benchmark_dumps():
    files = [p for p in (ROOT / "docs").rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix in (".json", ".svg")], "benchmark outputs belong in bench-results/"
    assert len(files) <= 25


def test_reference_matches_the_code():
    stale = [name for name, text in reference.pages().items()
             if (reference.PAGES / name).read_text() != text]
    assert not stale, f"docs/reference/{stale} out of date: run `python -m tools.reference`"


def test_every_command_and_flag_is_in_the_cli_reference():
    page = (reference.PAGES / "cli.md").read_text()
    for name, command in reference._subparsers(_parser()).items():
        assert f"## {name}\n" in page and name in _COMMANDS
        for action in reference.flags(command):
            for flag in action.option_strings:
                assert f"`{flag}`" in page.split(f"## {name}\n", 1)[1], f"{name} {flag} missing from the CLI reference"


def recipe_names() -> list[str]:
    import yaml

    return [yaml.safe_load(f.read_text())["name"] for f in shipped_files()]


def test_every_recipe_is_in_the_readme_table_and_the_reference():
    readme = README.read_text()
    table = {line.split("|")[2].strip() for line in readme.splitlines() if re.match(r"\|\s*\d+\s*\|", line)}
    ref = (reference.PAGES / "recipes.md").read_text()
    for name in recipe_names():
        assert name in table, f"recipe {name!r} missing from README.md's recipe table"
        assert f"## {name}\n" in ref, f"recipe {name!r} missing from docs/reference/recipes.md"


def test_docs_build_strictly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
