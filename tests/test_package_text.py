"""The package speaks in contracts: no bundled example's name, no run id, no design-notes citation.

Evidence for a rule (which benchmark run showed it, on which example) belongs in docs and
commit messages; the package's own text says what a function promises.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "autotune"
DESIGN_NOTES = "DESIGN" + ".md"  # built, so this file does not cite it
CITATION_DIRS = ("autotune", "tests", "benchmarks", "examples", "recipes")
RUN_ID = re.compile(r"\bs\d{2}[a-z]?\b")


def example_names() -> list[str]:
    """The bundled examples' names: the stems of examples/*.py, private helpers left out."""
    return sorted(p.stem for p in (ROOT / "examples").glob("*.py") if not p.stem.startswith("_"))


def package_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def where(path: Path, line: int) -> str:
    """`file:line`, relative to the repository when the file is in it."""
    return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{line}"


def example_mentions(files: list[Path], names: list[str]) -> list[str]:
    """`file:line: name` for each whole-word, case-sensitive mention of an example's name."""
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    out = []
    for path in files:
        for no, line in enumerate(path.read_text().splitlines(), 1):
            out += [f"{where(path, no)}: {m.group(1)}" for m in pattern.finditer(line)]
    return out


def prose(path: Path) -> list[tuple[int, str]]:
    """Every docstring and `#` comment of a Python file, line by line, with its line number."""
    text = path.read_text()
    out = []
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out += [(first.lineno + i, line) for i, line in enumerate(first.value.value.splitlines())]
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    return out


def run_ids(files: list[Path]) -> list[str]:
    """`file:line: id` for each run id (`s35`, `s19c`) in a docstring or comment."""
    return [f"{where(path, no)}: {m.group(0)}" for path in files for no, line in prose(path)
            for m in RUN_ID.finditer(line)]


def design_citations(dirs: list[Path]) -> list[str]:
    out = []
    for d in dirs:
        for path in sorted(p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            try:
                lines = path.read_text().splitlines()
            except (UnicodeDecodeError, OSError):
                continue
            out += [where(path, no) for no, line in enumerate(lines, 1) if DESIGN_NOTES in line]
    return out


def test_examples_are_found():
    names = example_names()
    assert "gpt" in names and "input_bound" in names and not any(n.startswith("_") for n in names)


def test_no_example_name_in_the_package():
    found = example_mentions(package_files(), example_names())
    assert not found, "bundled example names in autotune/ (say the reason, not the example):\n" + "\n".join(found)


def test_no_run_id_in_the_package_prose():
    found = run_ids(package_files())
    assert not found, "run ids in autotune/ docstrings or comments:\n" + "\n".join(found)


def test_no_design_notes_citation():
    found = design_citations([ROOT / d for d in CITATION_DIRS if (ROOT / d).is_dir()])
    assert not found, f"{DESIGN_NOTES} cited (say what is meant instead):\n" + "\n".join(found)


def test_the_checks_catch_a_plant(tmp_path):
    plant = tmp_path / "autotune" / "planted.py"
    plant.parent.mkdir()
    plant.write_text('"""Kept at 1.20x on gpt (s35)."""\n\nX = 1  # see ' + DESIGN_NOTES + "; input_bound_x is fine\n")
    assert example_mentions([plant], example_names()) == ["planted.py:1: gpt"]
    assert run_ids([plant]) == ["planted.py:1: s35"]
    assert design_citations([tmp_path]) == ["planted.py:3"]
