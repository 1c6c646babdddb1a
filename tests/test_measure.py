"""What the protocol measures: stage attribution checked with planted sleeps, the window
plan, and the summary's shape as the typed record."""

from __future__ import annotations

import multiprocessing
import time

import torch

from autotune import Protocol, Summary, TrainConfig, Workload, measure
from autotune.measure import Measurement, Session, Window
from workloads import Vectors, ce_loss, mlp

CPU = torch.device("cpu")
DATA_SLEEP = 0.004  # per sample: 8 samples -> 32 ms of waiting for data per step
LOSS_SLEEP = 0.012  # inside the loss: forward


class SlowVectors(Vectors):
    def __getitem__(self, i):
        time.sleep(DATA_SLEEP)
        return super().__getitem__(i)


def slow_loss(model, batch):
    time.sleep(LOSS_SLEEP)
    return ce_loss(model, batch)


def test_planted_sleeps_land_in_their_stages():
    wl = Workload(name="planted", model=mlp, dataset=lambda: SlowVectors(64),
                  optimizer=lambda p: torch.optim.SGD(p, lr=0.1), loss=slow_loss, batch_size=8)
    s = measure(wl, TrainConfig(), CPU, Protocol(windows=2, steps=4, warmup_steps=1, profile_steps=1)).summary()
    # A sleep never returns early: each stage holds at least what was planted in it.
    assert s.stages["data"].s >= 8 * DATA_SLEEP * 0.95
    assert s.stages["forward"].s >= LOSS_SLEEP * 0.95
    # ...and the planted sleeps are not booked to the stages that had none.
    planted = s.stages["data"].s + s.stages["forward"].s
    assert s.stages["backward"].s + s.stages["optimizer"].s < planted / 2
    assert max(s.stages, key=lambda k: s.stages[k].s) == "data"
    assert s.measured_steps == 8


def test_window_plan_grows_with_the_loader_buffer():
    p = Protocol(warmup_steps=3, steps=12)
    assert p.plan(0) == (3, 12)
    assert p.plan(8) == (11, 32)  # k buffered batches: k more warm-up, at least 4k measured


def test_summary_is_the_typed_record_and_round_trips():
    m = Measurement(config=TrainConfig().flat())
    steps = [{"data": 0.001, "h2d": 0.0, "forward": 0.002, "backward": 0.003, "optimizer": 0.001, "other": 0.0, "step": 0.007}]
    m.windows = [Window(samples=16, wall_s=0.01, steps=steps * 2, losses=[1.0, 0.9]),
                 Window(samples=16, wall_s=0.02, steps=steps * 2, losses=[0.8, 0.7])]
    s = m.summary()
    assert isinstance(s, Summary)
    assert s.samples_per_s == 32 / 0.03
    assert s.windows_samples_per_s == [1600.0, 800.0]
    assert abs(s.stages["backward"].share - 3 / 7) < 1e-9
    assert Summary.model_validate_json(s.model_dump_json()) == s


WORKER_START_SLEEP = 1.0  # planted: each new worker process sleeps once before its first sample
_started: set[int] = set()


class SlowStart(Vectors):
    def __getitem__(self, i):
        import os

        if torch.utils.data.get_worker_info() is not None and os.getpid() not in _started:
            _started.add(os.getpid())
            time.sleep(WORKER_START_SLEEP)
        return super().__getitem__(i)


def _windows(persistent: bool) -> tuple[list, dict]:
    wl = Workload(name="epochs", model=mlp, dataset=lambda: SlowStart(64),
                  optimizer=lambda p: torch.optim.SGD(p, lr=0.1), loss=ce_loss, batch_size=8)
    config = TrainConfig().with_changes({"data.num_workers": 1, "data.persistent_workers": persistent})
    m = measure(wl, config, CPU, Protocol(windows=3, steps=4, warmup_steps=0, profile_steps=1))
    return m.windows, m.one_time


def test_epoch_starts_are_charged_so_persistent_workers_are_measured():
    """A fresh iterator is a new epoch: without persistent workers each one starts its
    workers again (here: a planted 1 s), and that cost, amortised over the epoch's 8 steps,
    is charged to the window's throughput. Persistent workers start once per run: a
    one-time cost, reported apart and charged to no window."""
    (plain, _), (kept, once) = _windows(False), _windows(True)
    # Every epoch of the plain loader pays the planted start: at least 1 s over 8 steps, 4 of them here.
    assert all(w.epoch_cost_s >= WORKER_START_SLEEP * 4 / 8 * 0.9 for w in plain)
    assert once["worker_start_s"] >= WORKER_START_SLEEP * 0.9  # the first epoch started the workers
    assert all(w.epoch_cost_s < WORKER_START_SLEEP * 4 / 8 * 0.5 for w in kept)
    assert all(w.samples_per_s == w.samples / (w.wall_s + w.epoch_cost_s) for w in plain + kept)


class BusyVectors(Vectors):
    def __getitem__(self, i):  # decoding: the loading thread computes for DATA_SLEEP
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < DATA_SLEEP:
            pass
        return super().__getitem__(i)


def _cpu_share(dataset, workers: int = 0) -> float | None:
    wl = Workload(name="loading", model=mlp, dataset=dataset, optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                  loss=ce_loss, batch_size=8)
    cfg = TrainConfig().with_changes({"data.num_workers": workers})
    return measure(wl, cfg, CPU, Protocol(windows=1, steps=2, warmup_steps=1, profile_steps=2)).summary() \
        .signals.data_cpu_share


def test_the_loading_threads_cpu_share_tells_decoding_from_waiting():
    """In-process loading that computes reads near 1 on an idle machine (less where other processes
    share the cores); one that sleeps (storage) near 0; with loader workers the training process
    only waits, so nothing is claimed."""
    busy, sleeping = _cpu_share(lambda: BusyVectors(64)), _cpu_share(lambda: SlowVectors(64))
    assert sleeping < 0.25 and busy > max(0.2, 4 * sleeping), (busy, sleeping)
    assert _cpu_share(lambda: SlowVectors(64), workers=1) is None


class Counted(Vectors):
    """Counts its fetches across loader worker processes (shared memory made before the fork)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.fetched = multiprocessing.Value("i", 0)

    def __getitem__(self, i):
        time.sleep(0.002)
        with self.fetched.get_lock():
            self.fetched.value += 1
        return super().__getitem__(i)


def test_persistent_workers_decode_nothing_after_their_window():
    """A window stops mid-epoch with batches already requested from the workers; persistent
    ones would decode them after it, inside the next (interleaved) config's window. They
    are waited out before the window returns, and the next window starts a fresh epoch."""
    wl = Workload(name="counted", model=mlp, dataset=lambda: Counted(256),
                  optimizer=lambda p: torch.optim.SGD(p, lr=0.1), loss=ce_loss, batch_size=4)
    config = TrainConfig().with_changes({"data.num_workers": 2, "data.prefetch_factor": 4,
                                         "data.persistent_workers": True})
    session = Session(wl, config, CPU, Protocol(windows=2, steps=4, warmup_steps=0, profile_steps=1))
    try:
        session.window()
        fetched = session.trainer.dataset.fetched.value
        time.sleep(0.3)  # ample for 2 workers to decode the 8 requested batches (64 ms of work)
        assert session.trainer.dataset.fetched.value == fetched
        assert session.window().samples > 0
    finally:
        session.close()
