"""Shared fixtures: the examples' targets, tiny workloads written as target files, and
the process state (intra-op threads) every test leaves as it found it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(ROOT))  # the benchmarks package, from the checkout

from workloads import write_target  # noqa: E402 - needs the path above

def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_threads():
    """Trainers set the process's intra-op threads; every test leaves them as found."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def example():
    """`example("input_bound")` is the target string of that example's small version."""
    return lambda name, fn="small": f"{EXAMPLES / (name + '.py')}:{fn}"


@pytest.fixture
def tiny_target(tmp_path):
    """`tiny_target("name.py", body)` writes a target file whose body can use the shared
    tiny workloads (`make(...)` builds one); returns its path."""

    return lambda name, body: write_target(tmp_path, name, body)


def pytest_sessionfinish(session, exitstatus):
    """Say what a test left running, then end the process with pytest's status.

    A thread that is not a daemon, or an exit handler that waits on one, would keep the
    finished suite from exiting and CI from finishing: the status is what the tests said,
    whatever lingers (named here, so it can be fixed)."""
    import os
    import threading

    lingering = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    children = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and (d / "stat").read_text().split(")")[-1].split()[1] == str(os.getpid()):
                children.append(d.name)
        except OSError:
            continue
    if lingering or children:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"left running by the tests: threads {lingering}, child processes {children}")
    session.config.add_cleanup(lambda: (sys.stdout.flush(), sys.stderr.flush(), os._exit(int(exitstatus))))
