"""The package's shape: no import cycles, small modules, no import side effects, and the
recipe files inside the built wheel and sdist."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tarfile
import warnings
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "autotune"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every autotune module `name` imports, at the top or inside functions (lazily)."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = {f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known}
            out |= subs
            if len(subs) < len(node.names):  # a name defined in `mod` itself: an import of `mod`
                out.add(mod)
    return {m for m in out if m in known and m != name}


def test_no_module_imports_one_that_imports_it_back():
    mods = _modules()
    graph = {name: _imports(name, path, set(mods)) for name, path in mods.items()}
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_finder_sees_a_lazy_cycle(tmp_path):
    """The check above can fail: a cycle made only of imports inside functions is found."""
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from .b import g\n")
    assert _imports("autotune.a", a, {"autotune.a", "autotune.b"}) == {"autotune.b"}
    pkg = tmp_path / "__init__.py"
    pkg.write_text("from . import a\nfrom .a import f\n")
    assert _imports("autotune", pkg, {"autotune", "autotune.a"}) == {"autotune.a"}
    a.write_text("from . import __version__\n")
    assert _imports("autotune.a", a, {"autotune", "autotune.a"}) == {"autotune"}


def test_modules_stay_small():
    big = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > 400}
    assert not big, big


def test_importing_autotune_changes_nothing_in_the_callers_process():
    code = (
        "import logging, sys, warnings, optuna, torch\n"
        "optuna.logging.set_verbosity(optuna.logging.INFO)\n"
        "path, filters, threads = list(sys.path), list(warnings.filters), torch.get_num_threads()\n"
        "import autotune, autotune.search, autotune.agent, autotune.cli, autotune.loop, autotune.report\n"
        "wl = autotune.load_workload(sys.argv[1])\n"
        "assert optuna.logging.get_verbosity() == optuna.logging.INFO, 'optuna verbosity changed'\n"
        "assert sys.path == path, 'sys.path changed'\n"
        "assert warnings.filters == filters, 'warning filters changed'\n"
        "assert torch.get_num_threads() == threads, 'threads changed'\n"
    )
    target = f"{ROOT / 'examples' / 'compute_bound.py'}:small"
    proc = subprocess.run([sys.executable, "-c", code, target], capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_dataloader_worker_warning_is_silenced_only_inside_autotune(recwarn):
    import torch

    from workloads import make

    from autotune import TrainConfig
    from autotune.loop import Trainer

    many = os.cpu_count() * 4 + 1
    t = Trainer(make(), TrainConfig().with_changes({"data.num_workers": many}), torch.device("cpu"))
    next(t.batches())
    assert not [w for w in recwarn if "DataLoader will create" in str(w.message)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        iter(t.loader)._shutdown_workers()
    assert any("DataLoader will create" in str(w.message) for w in caught), "the filter must not leak"


@pytest.mark.slow
def test_wheel_and_sdist_carry_the_recipes_and_a_fresh_install_lists_them(tmp_path):
    recipes = sorted(p.name for p in (ROOT / "recipes").glob("*.yaml"))
    assert recipes
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    wheel, = dist.glob("*.whl")
    sdist, = dist.glob("*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    assert sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("autotune/recipe_files/") and n.endswith(".yaml")) == recipes
    assert "autotune/report/report.schema.json" in names
    shipped = {n.rsplit("/", 1)[0] for n in names if n.endswith(".py")}
    source = {str(p.parent.relative_to(ROOT)) for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    assert source <= shipped, f"packages missing from the wheel: {sorted(source - shipped)}"
    assert not [n for n in names if n.startswith(("benchmarks/", "autotune/bench/"))], "the benchmark is not shipped"
    with tarfile.open(sdist) as tar:
        members = tar.getnames()
    assert sorted(m.rsplit("/", 1)[1] for m in members if "/recipes/" in m and m.endswith(".yaml")) == recipes

    # A non-editable install in a fresh venv: its own autotune, this venv's dependencies.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (Path(site) / "deps.pth").write_text("\n".join(deps) + "\n")  # a path entry: editable finders are not run
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", site, str(wheel)],
                   check=True, capture_output=True, timeout=600)
    where = subprocess.run([str(py), "-c", "import autotune; print(autotune.__file__)"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=300)
    assert where.stdout.startswith(site), (where.stdout, where.stderr)
    listed = subprocess.run([str(py), "-m", "autotune", "recipes"], capture_output=True, text=True, cwd=tmp_path,
                            timeout=300)
    assert listed.returncode == 0, listed.stderr
    for name in ("dataloader", "amp", "compile", "activation-checkpointing"):
        assert name in listed.stdout, name
