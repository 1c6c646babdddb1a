"""Every bad input a hostile user can type exits 2 with a one-paragraph message.

One table: the command line, the files it needs, and a fragment the message must hold.
Each case asserts exit code 2, a message that starts with "error: " (or, for an error in
the user's own code, their traceback before it) and no traceback of autotune's own code.
Almost every case fails before anything is measured; the few that need a training step
(a loss without grad, an optimizer that is not one) use a two-window, two-step protocol.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from autotune.cli import main
from workloads import write_target

AUTOTUNE_ROOT = str(Path(__file__).resolve().parent.parent / "autotune")
FAST = ["--device", "cpu", "--windows", "2", "--steps", "2", "--warmup", "0"]
DIR = object()  # a file entry that is a folder
GOOD = "def workload():\n    return make()\n"
RECIPE = "name: mine\ntargets: [input]\ncost: 1\ntradeoffs: t\nknobs:\n  data.num_workers: {KNOB}\n"


@dataclass
class Case:
    id: str
    argv: list[str]
    expect: str | tuple[str, ...]
    files: dict[str, object] = field(default_factory=dict)  # name -> text, bytes, DIR, or ("target", body)
    user_code: bool = False  # the message is the user's traceback, then the error line
    marks: tuple = ()


def target(body: str) -> tuple[str, str]:
    return ("target", body)


def recipe(knob: str = "{choices: [1, 2]}", text: str | None = None) -> dict[str, object]:
    return {"r/mine.yaml": RECIPE.replace("{KNOB}", knob) if text is None else text}


def report_json(mutate) -> str:
    from test_report import make_report

    data = json.loads(make_report().model_dump_json())
    return mutate(data) if callable(mutate) else mutate


def _replace_workload(text: str):
    return lambda data: json.dumps({**data, "workload": "PLACEHOLDER"}).replace('"PLACEHOLDER"', text)


ROOT_ONLY = pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
T = "{tmp}"

CASES = [
    # --- sizes -----------------------------------------------------------------------------
    Case("size-400-digits", ["profile", "good.py", "--memory-limit", "9" * 400], ("--memory-limit", "at most 1024TiB")),
    Case("size-fraction", ["profile", "good.py", "--memory-limit", "0.4"], ("'0.4'", "not a whole number of bytes")),
    Case("size-fraction-bytes", ["profile", "good.py", "--memory-limit", "0.4B"], ("'0.4B'", "not a whole number")),
    Case("size-fraction-kb", ["profile", "good.py", "--memory-limit", "1.0005KB"], "not a whole number"),
    Case("size-zero", ["profile", "good.py", "--memory-limit", "0"], ("--memory-limit '0'", "more than zero")),
    Case("size-empty", ["profile", "good.py", "--memory-limit="], ("--memory-limit ''", "not a size")),
    Case("size-too-big", ["profile", "good.py", "--memory-limit", "2000TiB"], "at most 1024TiB"),
    Case("size-many-decimals", ["profile", "good.py", "--memory-limit", "1." + "0" * 5000 + "1G"], "more than 30 decimals"),
    Case("size-other-script-digits", ["profile", "good.py", "--memory-limit", "\u0665MB"], "not a size"),
    Case("size-negative", ["profile", "good.py", "--memory-limit=-1GB"], "not a size"),
    # --- durations -------------------------------------------------------------------------
    Case("timeout-overflow", ["tune", "good.py", "--trial-timeout", "3000000h"], ("--trial-timeout", "at most 720h")),
    Case("budget-overflow", ["tune", "good.py", "--budget", "3000000h"], ("--budget '3000000h'", "at most 720h")),
    Case("budget-400-digits", ["tune", "good.py", "--budget", "9" * 400], ("--budget", "more than autotune accepts")),
    Case("budget-zero", ["tune", "good.py", "--budget", "0"], ("--budget '0'", "more than zero")),
    Case("budget-zero-seconds", ["tune", "good.py", "--budget", "0.000s"], "more than zero"),
    Case("budget-negative", ["tune", "good.py", "--budget=-5m"], ("--budget '-5m'", "not a duration")),
    Case("budget-negative-argparse", ["tune", "good.py", "--budget", "-5m"], ("--budget", "--flag=VALUE")),
    Case("budget-exponent", ["tune", "good.py", "--budget", "1e3"], "not a duration"),
    Case("budget-empty", ["tune", "good.py", "--budget="], "not a duration"),
    Case("timeout-zero", ["tune", "good.py", "--trial-timeout", "0s"], ("--trial-timeout '0s'", "more than zero")),
    Case("timeout-garbage", ["tune", "good.py", "--trial-timeout", "forever"], "not a duration"),
    # --- whole numbers ---------------------------------------------------------------------
    Case("seed-negative", ["profile", "good.py", "--seed", "-1"], ("--seed -1", "2**32")),
    Case("seed-too-big", ["profile", "good.py", "--seed", str(2**32)], ("--seed 4294967296", "4294967295")),
    Case("seed-tune", ["tune", "good.py", "--seed", "-7"], "--seed -7"),
    Case("seed-train", ["train", "good.py", "--config", "empty.yaml", "--seed", "-1"], "--seed -1",
         {"empty.yaml": ""}),
    Case("seed-not-int", ["profile", "good.py", "--seed", "1.5"], ("--seed", "invalid int value")),
    Case("trials-zero", ["tune", "good.py", "--trials", "0"], "--trials 0"),
    Case("trials-huge", ["tune", "good.py", "--trials", str(10**12)], ("--trials", "out of range")),
    Case("windows-one", ["profile", "good.py", "--windows", "1"], ("--windows 1", "spread between windows")),
    Case("windows-negative", ["profile", "good.py", "--windows", "-3"], "--windows -3"),
    Case("windows-huge", ["profile", "good.py", "--windows", str(10**20)], ("--windows", "from 2 to 1000")),
    Case("windows-word", ["profile", "good.py", "--windows", "many"], "invalid int value"),
    Case("steps-zero", ["profile", "good.py", "--steps", "0"], "--steps 0"),
    Case("steps-huge", ["tune", "good.py", "--steps", str(10**9)], ("--steps", "out of range")),
    Case("warmup-negative", ["profile", "good.py", "--warmup", "-1"], "--warmup -1"),
    Case("warmup-huge", ["profile", "good.py", "--warmup", str(10**9)], ("--warmup", "out of range")),
    Case("train-steps-zero", ["train", "good.py", "--config", "empty.yaml", "--steps", "0"], "--steps 0",
         {"empty.yaml": ""}),
    Case("unknown-flag", ["profile", "good.py", "--no-such-flag"], "unrecognized arguments"),
    Case("unknown-device", ["profile", "good.py", "--device", "tpu"], "--device 'tpu'"),
    # --- targets ---------------------------------------------------------------------------
    Case("target-relative-module", ["profile", ".mod:f"], ("'.mod'", "relative")),
    Case("target-empty-module", ["profile", ":f"], "is empty"),
    Case("target-empty", ["profile", ""], "target is empty"),
    Case("target-no-function", ["profile", "mod:"], "nothing after the colon"),
    Case("target-file-no-function", ["profile", "good.py:"], "nothing after the colon"),
    Case("target-bad-function-name", ["profile", "good.py:1x"], "not a Python function name"),
    Case("target-missing-file", ["profile", "nope.py"], "does not exist"),
    Case("target-missing-module", ["profile", "no_such_pkg_xyz.mod:f"], "no module named 'no_such_pkg_xyz'"),
    Case("target-folder-named-py", ["profile", "folder.py"], "is a folder", {"folder.py": DIR}),
    Case("target-folder", ["profile", f"{T}/folder"], "is a folder", {"folder": DIR}),
    Case("target-not-python", ["profile", f"{T}/notes.txt"], "not a Python file", {"notes.txt": "hello\n"}),
    Case("target-not-utf8-name", ["profile", "bad\udcff.py"], "not valid UTF-8"),
    Case("module-raises-on-import", ["profile", "boom_on_import_mod:workload"], "RuntimeError: module boom",
         {"boom_on_import_mod.py": "raise RuntimeError('module boom')\n"}, user_code=True),
    Case("module-missing-dependency", ["profile", "needs_dep_mod:workload"], "my_private_lib_xyz",
         {"needs_dep_mod.py": "import my_private_lib_xyz\n"}, user_code=True),
    Case("file-raises-on-import", ["profile", "boom.py"], "ValueError: file boom",
         {"boom.py": "raise ValueError('file boom')\n"}, user_code=True),
    Case("file-syntax-error", ["profile", "syntax.py"], "SyntaxError", {"syntax.py": "def workload(:\n"},
         user_code=True),
    Case("file-calls-sys-exit", ["profile", "exits.py"], "raised SystemExit: 3",
         {"exits.py": "import sys\nsys.exit(3)\n"}, user_code=True),
    Case("file-parses-the-command-line", ["profile", "cli_script.py"], "raised SystemExit: 2",
         {"cli_script.py": "import argparse\nargparse.ArgumentParser().parse_args(['--lr', '3'])\n"}, user_code=True),
    Case("workload-takes-arguments", ["profile", "w.py"], "missing 1 required positional argument",
         {"w.py": target("def workload(size):\n    return make()\n")}, user_code=True),
    # --- the workload ----------------------------------------------------------------------
    Case("name-not-text", ["profile", "w.py"], "name must be a non-empty string, got 5",
         {"w.py": target("def workload():\n    return make(name=5)\n")}),
    Case("name-empty", ["profile", "w.py"], "name must be a non-empty string",
         {"w.py": target("def workload():\n    return make(name='  ')\n")}),
    Case("dataset-none", ["profile", "w.py"], ("dataset must be", "got NoneType"),
         {"w.py": target("def workload():\n    return make(dataset=None)\n")}),
    Case("dataset-set-to-none-after-construction", ["profile", "w.py", *FAST], ("dataset must be", "got NoneType"),
         {"w.py": target("def workload():\n    w = make()\n    w.dataset = None\n    return w\n")}),
    Case("batch-size-set-to-zero-after-construction", ["profile", "w.py", *FAST], "batch_size must be a positive int",
         {"w.py": target("def workload():\n    w = make()\n    w.batch_size = 0\n    return w\n")}),
    Case("dataset-len-raises-when-the-loader-is-built", ["profile", "w.py", *FAST],
         ("building a DataLoader over the workload's dataset", "len broke"),
         {"w.py": target("class B(Vectors):\n    calls = 0\n\n    def __len__(self):\n        B.calls += 1\n"
                         "        if B.calls > 1:\n            raise RuntimeError('len broke')\n        return 64\n\n"
                         "def workload():\n    return make(dataset=B(64))\n")}, user_code=True),
    Case("dataset-factory-none", ["profile", "w.py", *FAST], "dataset factory returned NoneType",
         {"w.py": target("def workload():\n    return make(dataset=lambda: None)\n")}),
    Case("batch-size-true", ["profile", "w.py"], "batch_size must be a positive int, got True",
         {"w.py": target("def workload():\n    return make(batch_size=True)\n")}),
    Case("checkpoint-blocks-int", ["profile", "w.py"], "checkpoint_blocks must be a tuple of module classes",
         {"w.py": target("def workload():\n    return make(checkpoint_blocks=5)\n")}),
    Case("checkpoint-blocks-instance", ["profile", "w.py"], "checkpoint_blocks must hold module classes",
         {"w.py": target("def workload():\n    return make(checkpoint_blocks=(nn.Linear(2, 2),))\n")}),
    Case("collate-not-callable", ["profile", "w.py"], "collate_fn must be callable",
         {"w.py": target("def workload():\n    return make(collate_fn='stack')\n")}),
    Case("dataset-negative-len", ["profile", "w.py", *FAST], "__len__() should return >= 0",
         {"w.py": target("class B(Vectors):\n    def __len__(self):\n        return -1\n\n"
                         "def workload():\n    return make(dataset=lambda: B(64))\n")}, user_code=True),
    Case("loss-without-grad", ["profile", "w.py", *FAST],
         ("loss(model, batch)", "requires_grad=False", "must depend on the model's parameters"),
         {"w.py": target("def workload():\n    return make(loss=lambda model, batch: torch.tensor(1.0))\n")}),
    Case("loss-detached", ["profile", "w.py", *FAST], "requires_grad=False",
         {"w.py": target("def workload():\n    return make(loss=lambda m, b: ce_loss(m, b).detach())\n")}),
    Case("optimizer-not-optimizer", ["profile", "w.py", *FAST], "not a torch.optim.Optimizer",
         {"w.py": target("def workload():\n    return make(optimizer=lambda params: 'sgd')\n")}),
    # --- train --config --------------------------------------------------------------------
    *[Case(f"config-{name}", ["train", "good.py", "--config", "c.yaml", "--device", "cpu"], expect, {"c.yaml": text})
      for name, text, expect in [
          ("not-utf8", b"data:\n  num_workers: \xff\xfe\n", "not UTF-8"),
          ("section-and-dotted", "data: 5\ndata.num_workers: 2\n", ("data: given as 5", "data.num_workers")),
          ("dotted-twice", "data: {num_workers: 1}\ndata.num_workers: 2\n", "given twice"),
          ("top-level-list", "- data\n- 2\n", "got a list"),
          ("top-level-number", "0\n", "got a number"),
          ("top-level-text", "hello\n", "got text"),
          ("int-key", "1: 2\n", "key 1 (int)"),
          ("int-key-in-section", "data: {1: 2}\n", "data.1"),
          ("list-value", "data: {num_workers: [1]}\n", "data.num_workers"),
          ("malformed", "data: [\n", "not valid YAML"),
          ("tab-indent", "data:\n\tnum_workers: 2\n", "not valid YAML"),
          ("huge-int", "data:\n  num_workers: " + "9" * 5000 + "\n", "cannot be read"),
          ("too-many-workers", "data:\n  num_workers: " + "9" * 30 + "\n", "less than or equal to 4096"),
          ("deep", "[" * 10000, "nests too deeply"),
          ("python-tag", "data: !!python/object/apply:os.system [echo]\n", "not valid YAML"),
          ("dot-key", ".: 1\n", "not a dotted key"),
      ]],
    Case("config-folder", ["train", "good.py", "--config", "cfgdir", "--device", "cpu"], "is a folder", {"cfgdir": DIR}),
    # --- recipe files ----------------------------------------------------------------------
    Case("recipe-not-utf8", ["recipes", "--recipes", "r"], "not UTF-8", {"r/mine.yaml": b"name: \xff\n"}),
    Case("recipe-malformed", ["recipes", "--recipes", "r"], "not valid YAML", {"r/mine.yaml": "name: [\n"}),
    Case("recipe-list", ["recipes", "--recipes", "r"], "must be a mapping", {"r/mine.yaml": "- a\n"}),
    Case("recipe-nested-choices", ["recipes", "--recipes", "r"], ("knobs.data.num_workers.choices", "plain values"),
         recipe("{choices: [[1, 2]]}")),
    Case("recipe-mapping-choice", ["recipes", "--recipes", "r"], "plain values", recipe("{choices: [{a: 1}]}")),
    Case("recipe-wrong-type-choice", ["recipes", "--recipes", "r"], "not a valid data.num_workers",
         recipe("{choices: [two]}")),
    Case("recipe-div-zero", ["recipes", "--recipes", "r"], ("knobs.data.num_workers.max", "divides by zero"),
         recipe("{choices: [1, 2], max: 'cores/0'}")),
    Case("recipe-div-zero-late", ["recipes", "--recipes", "r"], "divides by zero",
         recipe("{choices: [1, 2], max: 'cores/(cores-1)'}")),
    Case("recipe-min-above-max", ["recipes", "--recipes", "r"], ("min 8 is above max 2", "no value is left"),
         recipe("{choices: [1, 2], min: 8, max: 2}")),
    Case("recipe-long-bound", ["recipes", "--recipes", "r"], "unsupported bound",
         recipe("{choices: [1], max: '" + "1+" * 5000 + "1'}")),
    Case("recipe-float-bound", ["recipes", "--recipes", "r"], "unsupported", recipe("{choices: [1], max: 2.5}")),
    Case("recipe-bool-bound", ["recipes", "--recipes", "r"], "unsupported bound", recipe("{choices: [1], max: true}")),
    Case("recipe-bad-device", ["recipes", "--recipes", "r"], "knobs.data.num_workers.device",
         recipe("{choices: [1], device: tpu}")),
    Case("recipe-unknown-knob-field", ["recipes", "--recipes", "r"], "unknown field(s) 'choises'",
         recipe("{choices: [1], choises: [2]}")),
    Case("recipe-nested-target", ["recipes", "--recipes", "r"], "field 'targets'",
         recipe(text=RECIPE.replace("[input]", "[[input]]").replace("{KNOB}", "{choices: [1]}"))),
    Case("recipe-name-list", ["recipes", "--recipes", "r"], "field 'name' must be non-empty text",
         recipe(text=RECIPE.replace("name: mine", "name: [1]").replace("{KNOB}", "{choices: [1]}"))),
    Case("recipe-name-null", ["recipes", "--recipes", "r"], "field 'name' must be non-empty text",
         recipe(text=RECIPE.replace("name: mine", "name:").replace("{KNOB}", "{choices: [1]}"))),
    Case("recipe-trials-bool", ["recipes", "--recipes", "r"], "field 'trials'",
         recipe(text=RECIPE.replace("{KNOB}", "{choices: [1]}") + "trials: true\n")),
    Case("recipe-self-referencing", ["recipes", "--recipes", "r"], "field 'targets'",
         recipe(text=RECIPE.replace("[input]", "&a [*a]").replace("{KNOB}", "{choices: [1]}"))),
    Case("recipe-file-is-folder", ["recipes", "--recipes", "r"], "cannot be read", {"r/x.yaml": DIR}),
    Case("recipes-not-a-folder", ["recipes", "--recipes", "file.txt"], "is not a folder", {"file.txt": "x"}),
    Case("recipe-via-tune", ["tune", "good.py", "--recipes", "r"], "divides by zero",
         recipe("{choices: [1, 2], max: 'batch/0'}")),
    # --- files written ---------------------------------------------------------------------
    Case("json-folder", ["profile", "good.py", "--json", "outdir"], ("--json", "is a folder"), {"outdir": DIR}),
    Case("trace-folder", ["profile", "good.py", "--trace", "outdir"], ("--trace", "is a folder"), {"outdir": DIR}),
    Case("json-under-a-file", ["profile", "good.py", "--json", "file.txt/sub/p.json"], ("--json", "cannot write there"),
         {"file.txt": "x"}),
    Case("json-empty", ["profile", "good.py", "--json="], "--json is empty"),
    Case("json-is-a-pipe", ["profile", "good.py", "--json", "fifo"], "not a regular file", {"fifo": "FIFO"}),
    Case("json-and-trace-same", ["profile", "good.py", "--json", "a.json", "--trace", "a.json"], "same file as --json"),
    Case("json-read-only", ["profile", "good.py", "--json", "ro/p.json"], "cannot write", {"ro": DIR},
         marks=(ROOT_ONLY,)),
    Case("out-is-a-file", ["tune", "good.py", "--out", "file.txt"], ("--out", "not a writable folder"),
         {"file.txt": "x"}),
    Case("out-report-is-folder", ["tune", "good.py", "--out", "o"], "holds a folder named report.json",
         {"o/report.json": DIR}),
    Case("out-empty", ["tune", "good.py", "--out="], "--out is empty"),
    Case("storage-empty", ["tune", "good.py", "--storage="], "--storage is empty"),
    Case("storage-bad", ["tune", "good.py", "--storage", "nosuchdb://x"], "cannot be opened"),
    Case("study-too-long", ["tune", "good.py", "--study", "s" * 600], "at most 512"),
    Case("only-unknown", ["tune", "good.py", "--only", "turbo"], "unknown recipe(s) turbo"),
    # --- autotune report DIR ---------------------------------------------------------------
    Case("report-huge-float", ["report", "o"], ("report.json", "1e400", "out of the range"),
         {"o/report.json": report_json(_replace_workload("1e400"))}),
    Case("report-huge-int", ["report", "o"], ("report.json", "too large"),
         {"o/report.json": report_json(_replace_workload("1" + "0" * 4000))}),
    Case("report-huge-int-past-python", ["report", "o"], ("report.json", "too large"),
         {"o/report.json": report_json(_replace_workload("1" + "0" * 5000))}),
    Case("report-deep", ["report", "o"], ("report.json", "nests deeper"), {"o/report.json": "[" * 10000}),
    Case("report-nan", ["report", "o"], ("report.json", "NaN is not a JSON number"),
         {"o/report.json": report_json(lambda d: json.dumps({**d, "speedup": {"ratio": float("nan")}}))}),
    Case("report-infinity", ["report", "o"], "Infinity is not a JSON number",
         {"o/report.json": report_json(lambda d: json.dumps({**d, "speedup": {"ratio": float("-inf")}}))}),
    Case("report-lone-surrogate", ["report", "o"], "not valid Unicode",
         {"o/report.json": report_json(_replace_workload('"\\ud800"'))}),
    Case("report-not-utf8", ["report", "o"], "cannot be read as JSON", {"o/report.json": b"{\"a\": \"\xff\"}"}),
    Case("report-json-is-folder", ["report", "o"], "is a folder", {"o/report.json": DIR}),
    Case("report-md-is-folder", ["report", "o"], ("report.md", "cannot be written"),
         {"o/report.json": report_json(json.dumps), "o/report.md": DIR}),
    Case("report-wrong-field", ["report", "o"], "not a valid autotune report",
         {"o/report.json": report_json(lambda d: json.dumps({**d, "steps": "x" * 100000}))}),
    Case("report-empty-dir", ["report", ""], "is empty"),
    Case("report-no-dir", ["report"], "needs a tune output folder"),
    # parallel trials
    Case("workers-more-than-cores", ["tune", "good.py", "--workers", "4096"], "--workers 4096"),
    Case("workers-too-many", ["tune", "good.py", "--workers", str(os.cpu_count() + 1)], "each worker needs a core"),
    Case("workers-negative", ["tune", "good.py", "--workers=-1"], "--workers -1 is out of range"),
    Case("workers-in-process", ["tune", "good.py", "--workers", "1", "--in-process"], "exclude each other"),
    Case("worker-no-storage", ["worker", "--study", "s"], "needs the run's storage"),
    Case("worker-empty-storage", ["worker", "--study", "s", "--storage", " "], "--storage is empty"),
    Case("worker-no-study", ["worker", "--storage", "sqlite:///x.db"], "--study"),
    Case("worker-bad-cores", ["worker", "--study", "s", "--storage", "sqlite:///x.db", "--cores", "99999"],
         "--cores '99999' cannot be used"),
    Case("worker-cores-text", ["worker", "--study", "s", "--storage", "sqlite:///x.db", "--cores", "a-b"],
         "--cores 'a-b' cannot be used"),
    Case("worker-bad-idle", ["worker", "--study", "s", "--storage", "sqlite:///x.db", "--idle-timeout", "soon"],
         "--idle-timeout"),
    Case("worker-no-such-run", ["worker", "--study", "nobody", "--storage", "journal:///{tmp}/j.log",
                                "--idle-timeout", "1s"], "no autotune run published it"),
    Case("worker-bad-storage", ["worker", "--study", "s", "--storage", "nosuch://x"], "cannot be opened"),
]


def _write(tmp_path: Path, files: dict[str, object]) -> None:
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is DIR:
            path.mkdir(parents=True, exist_ok=True)
        elif content == "FIFO":  # stands for /dev/null: a file that is not a regular file
            os.mkfifo(path)
        elif isinstance(content, tuple):
            write_target(path.parent, path.name, content[1])
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def _argv(case: Case, tmp_path: Path) -> list[str]:
    """The case's command line; it runs in its own folder, so relative names are its files."""
    argv = [a.replace(T, str(tmp_path)) for a in case.argv]
    if argv[0] == "tune" and not any(a.startswith("--out") for a in argv):
        argv += ["--out", str(tmp_path / "out")]  # never the default folder in the working directory
    return argv


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_bad_input_exits_2_with_a_message(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # module targets written by the case
    write_target(tmp_path, "good.py", GOOD)
    _write(tmp_path, case.files)
    if case.id == "json-read-only":
        (tmp_path / "ro").chmod(0o500)
    try:
        code = main(_argv(case, tmp_path))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    expected = (case.expect,) if isinstance(case.expect, str) else case.expect
    for fragment in expected:
        assert fragment in err, (fragment, err)
    if case.user_code:  # their traceback (after anything their code printed), then the error line
        assert "Traceback (your code" in err, err
        assert "\nerror: " in err and "error in your workload code" in err
        assert AUTOTUNE_ROOT not in err, "autotune's own frames are left out"
    else:
        assert err.startswith("error: "), err
        assert "Traceback" not in err, err
    assert len(err) < 3000, "one paragraph, not a dump"


def test_json_in_a_folder_that_refuses_files_even_for_root(tmp_path, capsys, monkeypatch):
    """Root may write anywhere `os.access` is asked about; the probe that really creates a
    file beside the target still fails on a read-only mount: simulated here."""
    import tempfile

    ro = tmp_path / "ro"
    ro.mkdir()
    real = tempfile.mkstemp

    def refuse(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == ro:
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    good = write_target(tmp_path, "good.py", GOOD)
    code = main(["profile", str(good), "--json", str(ro / "p.json"), *FAST])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --json ") and "Permission denied" in err, err
    assert "Traceback" not in err
