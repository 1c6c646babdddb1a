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
