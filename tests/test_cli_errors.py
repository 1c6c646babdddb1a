"""Bad input gives exit code 2 and a message, never a traceback of autotune's own code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune.cli import main
from workloads import write_target as write

ROOT = Path(__file__).resolve().parent.parent
FAST = ["--device", "cpu", "--windows", "2", "--steps", "4", "--warmup", "1"]


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err, err
    assert err.startswith("error: "), err
    for n in needles:
        assert n in err, (n, err)


@pytest.fixture
def good(tmp_path):
    return write(tmp_path, "good.py", "def workload():\n    return make()\n")


# --- the target ------------------------------------------------------------------------


def test_missing_target_file(capsys, tmp_path):
    missing = tmp_path / "nope.py"
    code, _, err = run_cli(capsys, "profile", missing, *FAST)
    assert_user_error(code, err, str(missing), "does not exist")


def test_missing_module_target(capsys):
    code, _, err = run_cli(capsys, "profile", "no_such_pkg_xyz.mod:build", *FAST)
    assert_user_error(code, err, "no_such_pkg_xyz")


def test_target_without_the_function(capsys, good):
    code, _, err = run_cli(capsys, "profile", f"{good}:build", *FAST)
    assert_user_error(code, err, "has no function 'build'")
    # the default name is `workload`
    other = good.parent / "nofunc.py"
    other.write_text("x = 1\n")
    code, _, err = run_cli(capsys, "profile", other, *FAST)
    assert_user_error(code, err, "has no function 'workload'", "def workload()")


def test_function_that_does_not_return_a_workload(capsys, tmp_path):
    path = write(tmp_path, "notwl.py", "def workload():\n    return {'model': 1}\n")
    code, _, err = run_cli(capsys, "profile", path, *FAST)
    assert_user_error(code, err, "returned dict", "not an autotune.Workload")


def test_invalid_workload_fields(capsys, tmp_path):
    path = write(tmp_path, "badwl.py", "def workload():\n    return make(batch_size=0, loss='ce')\n")
    code, _, err = run_cli(capsys, "profile", path, *FAST)
    assert_user_error(code, err, "batch_size", "loss must be callable")


# --- train --config ----------------------------------------------------------------------


def test_train_config_with_unknown_keys_lists_them(capsys, tmp_path, good):
    cfg = tmp_path / "tuned.yaml"
    cfg.write_text("data:\n  num_wrkers: 2\n  pin_memroy: true\nlayout:\n  channels_last: false\n")
    code, _, err = run_cli(capsys, "train", good, "--config", cfg, "--device", "cpu", "--steps", "2")
    assert_user_error(code, err, "2 error(s)", "data.num_wrkers", "data.pin_memroy", "unknown key", str(cfg))


def test_train_config_with_invalid_values_lists_them(capsys, tmp_path, good):
    cfg = tmp_path / "tuned.yaml"
    cfg.write_text("precision:\n  amp: fp8\ncompile:\n  mode: turbo\nbackend:\n  num_threads: 0\n")
    code, _, err = run_cli(capsys, "train", good, "--config", cfg, "--device", "cpu", "--steps", "2")
    assert_user_error(code, err, "3 error(s)", "precision.amp", "compile.mode", "backend.num_threads")


def test_train_config_that_does_not_apply_to_the_device(capsys, tmp_path, good):
    cfg = tmp_path / "tuned.yaml"
    cfg.write_text("data:\n  pin_memory: true\nmemory:\n  micro_batch_size: 5\n")
    code, _, err = run_cli(capsys, "train", good, "--config", cfg, "--device", "cpu", "--steps", "2")
    assert_user_error(code, err, "2 error(s)", "data.pin_memory", "memory.micro_batch_size")


def test_train_missing_config_file(capsys, tmp_path, good):
    code, _, err = run_cli(capsys, "train", good, "--config", tmp_path / "none.yaml", "--device", "cpu")
    assert_user_error(code, err, "none.yaml", "does not exist")


def test_train_with_a_good_config_succeeds(capsys, tmp_path, good):
    cfg = tmp_path / "tuned.yaml"
    cfg.write_text("memory:\n  micro_batch_size: 8\n")
    code, out, err = run_cli(capsys, "train", good, "--config", cfg, "--device", "cpu", "--steps", "3")
    assert code == 0, err
    assert "tiny: 3 steps" in out and "memory.micro_batch_size=8" in out


def test_train_zero_steps(capsys, tmp_path, good):
    cfg = tmp_path / "tuned.yaml"
    cfg.write_text("")
    code, _, err = run_cli(capsys, "train", good, "--config", cfg, "--device", "cpu", "--steps", "0")
    assert_user_error(code, err, "--steps 0")


# --- the workload's data and loss --------------------------------------------------------


def test_iterable_dataset_that_yields_nothing(capsys, tmp_path, good):
    path = write(tmp_path, "empty.py", "def workload():\n    return make(dataset=Empty())\n")
    cfg = tmp_path / "tuned.yaml"
    cfg.write_text("")
    code, _, err = run_cli(capsys, "train", path, "--config", cfg, "--device", "cpu", "--steps", "2")
    assert_user_error(code, err, "yielded no batch")
    code, _, err = run_cli(capsys, "profile", path, *FAST)
    assert_user_error(code, err, "yielded no batch")


def test_dataset_with_no_samples(capsys, tmp_path):
    path = write(tmp_path, "zero.py", "def workload():\n    return make(dataset=lambda: Vectors(0))\n")
    code, _, err = run_cli(capsys, "profile", path, *FAST)
    assert_user_error(code, err, "yields 0 sample(s)", "fewer than one batch")


def test_loss_that_is_not_a_scalar(capsys, tmp_path):
    path = write(tmp_path, "vecloss.py", """
        def workload():
            return make(loss=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1], reduction="none"))
    """)
    code, _, err = run_cli(capsys, "profile", path, *FAST)
    assert_user_error(code, err, "not a scalar tensor", "(16,)")


# --- flags -------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_device_cuda_without_cuda(capsys, good):
    code, _, err = run_cli(capsys, "profile", good, "--device", "cuda", "--windows", "2", "--steps", "4")
    assert_user_error(code, err, "--device cuda", "CUDA is not available")


def test_unknown_device(capsys, good):
    code, _, err = run_cli(capsys, "profile", good, "--device", "tpu")
    assert_user_error(code, err, "'tpu'")


@pytest.mark.parametrize("limit", ["lots", "-1GB", "12XB"])
def test_memory_limit_garbage(capsys, good, limit):
    code, _, err = run_cli(capsys, "profile", good, *FAST, f"--memory-limit={limit}")
    assert_user_error(code, err, "--memory-limit", repr(limit), "512MB")


def test_argparse_errors_exit_2(capsys, good):
    with pytest.raises(SystemExit) as info:
        main(["profile", str(good), "--no-such-flag"])
    assert info.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_windows_below_two(capsys, good):
    code, _, err = run_cli(capsys, "profile", good, "--device", "cpu", "--windows", "1")
    assert_user_error(code, err, "--windows")


# --- exceptions raised in the user's own code --------------------------------------------


def _assert_user_traceback(code: int, err: str, filename: str, exc_text: str) -> None:
    assert code == 2, err
    assert filename in err, err
    assert exc_text in err, err
    assert "your workload code" in err
    # autotune's and torch's frames are left out
    assert "autotune/loop.py" not in err and "autotune/measure.py" not in err
    assert "/torch/" not in err


def test_exception_in_the_users_model_shows_their_frame(capsys, tmp_path):
    path = write(tmp_path, "boom_model.py", """
        class Broken(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 3)

            def forward(self, x):
                raise ValueError("shape mismatch in my model")


        def workload():
            return make(model=Broken)
    """)
    code, _, err = run_cli(capsys, "profile", path, *FAST)
    _assert_user_traceback(code, err, "boom_model.py", "ValueError: shape mismatch in my model")
    assert 'raise ValueError("shape mismatch in my model")' in err  # their source line


def test_exception_in_the_users_model_factory(capsys, tmp_path):
    path = write(tmp_path, "boom_factory.py", """
        def build():
            raise RuntimeError("weights file missing")


        def workload():
            return make(model=build)
    """)
    cfg = tmp_path / "tuned.yaml"
    cfg.write_text("")
    code, _, err = run_cli(capsys, "train", path, "--config", cfg, "--device", "cpu", "--steps", "1")
    _assert_user_traceback(code, err, "boom_factory.py", "RuntimeError: weights file missing")


def test_exception_while_importing_the_target(capsys, tmp_path):
    path = write(tmp_path, "boom_import.py", "raise ImportError('needs my_private_lib')\n")
    code, _, err = run_cli(capsys, "profile", path, *FAST)
    _assert_user_traceback(code, err, "boom_import.py", "needs my_private_lib")


def test_exception_in_the_users_dataset(capsys, tmp_path):
    path = write(tmp_path, "boom_data.py", """
        class Bad(Vectors):
            def __getitem__(self, i):
                raise OSError("corrupt record")


        def workload():
            return make(dataset=lambda: Bad(64))
    """)
    code, _, err = run_cli(capsys, "profile", path, *FAST)
    _assert_user_traceback(code, err, "boom_data.py", "corrupt record")


# --- success, for contrast ---------------------------------------------------------------


def test_profile_succeeds_and_writes_json(capsys, tmp_path, good):
    out_json = tmp_path / "out" / "profile.json"
    code, out, err = run_cli(capsys, "profile", good, *FAST, "--json", out_json, "--memory-limit", "1GiB")
    assert code == 0, err
    assert "tiny on cpu" in out
    doc = json.loads(out_json.read_text())
    assert doc["workload"] == "tiny" and doc["device"] == "cpu"
    assert doc["memory_limit_bytes"] == 2**30
    assert doc["protocol"]["windows"] == 2 and doc["protocol"]["steps"] == 4
    assert doc["measurement"]["measured_steps"] == 8
    assert doc["diagnosis"]["bottleneck"]
    assert set(doc["lowp_matmul"]) == {"bf16", "fp16"}  # the probe that ranks amp, as tune's would


def test_trace_and_json_written_across_filesystems(capsys, tmp_path, good):
    """The temporary file of an atomic write sits beside its target, so a target on another
    filesystem (here tmpfs) than the temp folder still gets written."""
    import os
    import shutil

    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a filesystem of its own")
    folder = shm / f"autotune-test-{os.getpid()}"
    try:
        code, _, err = run_cli(capsys, "profile", good, *FAST, "--trace", folder / "trace.json",
                                 "--json", folder / "profile.json")
        assert code == 0, err
        assert json.loads((folder / "trace.json").read_text())["traceEvents"]
        assert json.loads((folder / "profile.json").read_text())["workload"] == "tiny"
        assert sorted(p.name for p in folder.iterdir()) == ["profile.json", "trace.json"], "no temporary file left"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- as a real process -------------------------------------------------------------------


def test_module_entry_point_missing_target_has_no_traceback(tmp_path):
    missing = tmp_path / "missing.py"
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", "profile", str(missing), "--device", "cpu"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "does not exist" in proc.stderr and str(missing) in proc.stderr


# --- user text is never markup -------------------------------------------------------------


@pytest.mark.parametrize("name", ["m[/x]", "[bold red]x[/]", "[link=https://e.org]x", ":thumbs_up: x\\"])
def test_workload_names_are_printed_literally(capsys, tmp_path, name):
    path = write(tmp_path, "named.py", f"def workload():\n    return make(name={name!r})\n")
    code, out, err = run_cli(capsys, "profile", path, *FAST)
    assert code == 0, err
    assert f"{name} on cpu" in out, out


def test_recipe_text_is_printed_literally(capsys, tmp_path):
    (tmp_path / "r.yaml").write_text(
        "name: '[bold]mine[/]'\nsummary: '[link=x]'\ntargets: [input]\ncost: 1\n"
        "knobs: {data.num_workers: {choices: [1]}}\ntradeoffs: 'costs [/] and [red]more'\n")
    code, out, err = run_cli(capsys, "recipes", "--recipes", tmp_path)
    assert code == 0, err
    assert "[link=x]" in out and "[bold]mine[/]" in out and "costs [/] and [red]more" in out


def test_exception_message_with_brackets_is_shown_literally(capsys, tmp_path):
    path = write(tmp_path, "brackets.py", """
        class Broken(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 3)

            def forward(self, x):
                raise ValueError("bad [/x] shape [bold]y[/]")


        def workload():
            return make(model=Broken)
    """)
    code, _, err = run_cli(capsys, "profile", path, *FAST)
    assert code == 2 and "ValueError: bad [/x] shape [bold]y[/]" in err, err


def _hostile_report():
    from test_report import make_report

    r = make_report().model_copy(deep=True)
    r.workload = "m[/x] | `x` # <script>"
    r.stop_reason = "# stopped [link=x]\n- not a list | pipe"
    rec = r.recommendations[0]
    rec.recipe = "evil|recipe\n  num_workers: 99  # [bold]x[/]"
    rec.reason = "why [/] | `tick`"
    rec.snippet = "print('```')\n```\n# not a heading"
    r.recommendations[1].reason = "rejected [red]x[/] |"
    r.steps[0].recipe = rec.recipe
    r.steps[0].trials[4].reason = "[/x] out of memory | `x`"
    r.diagnosis.reason = "[bold]x[/] | <b>"
    return r


def test_terminal_output_of_a_run_shows_user_text_literally():
    from rich.progress import Progress

    from autotune.report.terminal import Display, console, print_tune_summary, progress

    r = _hostile_report()
    with console.capture() as cap:
        print_tune_summary(r, "runs/[bold]out")
        with progress() as prog:
            shown = Display(prog)
            shown.phase("[/x] phase")
            shown.recipe(1, r.steps[0].recipe, 3)
            for t in r.steps[0].trials:
                shown.trial(t)
            (task,) = prog.tasks
            assert task.description == f"round 1: {r.steps[0].recipe}"
            shown.decision("[bold]r[/]", False, "reason [/x] [link=y]")
        with Progress(console=console) as markup:  # rich's default columns read markup: escaped there
            Display(markup).recipe(2, "m[/x]", 1)
            assert markup.tasks[0].description == "m\\[/x]".replace("m", "round 2: m", 1)
    text = cap.get()
    for literal in ("m[/x] | `x` # <script>", "# stopped [link=x]", "[red]x[/] |", "[bold]r[/]: ",
                    "reason [/x] [link=y]", "[bold]x[/] | <b>", "runs/[bold]out/tuned.yaml"):
        assert literal in text, (literal, text)


def _cells(line: str) -> int:
    """The cells of a Markdown table row: `|` not escaped by a backslash separate them."""
    return sum(1 for i, ch in enumerate(line) if ch == "|" and (i == 0 or line[i - 1] != "\\")) - 1


def test_markdown_escapes_user_text(tmp_path):
    from autotune.report import render_html, render_markdown

    r = _hostile_report()
    md = render_markdown(r)
    lines = md.splitlines()
    assert lines[0] == r"# autotune report: m\[/x\] \| \`x\` \# \<script\>"
    width = None
    for line in lines:  # every row of every table has as many cells as its header
        if line.startswith("|"):
            if width is None:
                width = _cells(line)
            assert _cells(line) == width, line
        else:
            width = None
    fence = next(x for x in lines if x.startswith("```") and x.endswith("python"))
    at = lines.index(fence)  # a fence longer than the snippet's own: its lines stay code
    assert fence == "````python" and lines[at + 1:at + 5] == ["print('```')", "```", "# not a heading", "````"]
    stop = lines[lines.index("## Stop reason") + 2]
    assert stop.startswith(r"\# stopped \[link=x\]") and "\n- not a list" not in md
    assert "evil\\|recipe" in md and "[bold]" not in md
    page = render_html(r)
    assert "<script>" not in page and "&lt;script&gt;" in page and "[bold]x[/] | &lt;b&gt;" in page


def test_tuned_yaml_comments_survive_hostile_reasons(tmp_path):
    import yaml

    from autotune.config import from_dict, from_flat
    from autotune.report import write_tuned_config

    r = _hostile_report()
    path = write_tuned_config(r, tmp_path)
    loaded = from_dict(yaml.safe_load(path.read_text()))
    assert loaded == from_flat(r.final_config)
    line = next(x for x in path.read_text().splitlines() if x.strip().startswith("num_workers:"))
    assert line.startswith("  num_workers: 8  # ") and "[bold]x[/]" in line
