"""The hand-written-loop helpers give the same training as the measured loop."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import autotune
from autotune import apply
from autotune.loop import Trainer


def _workload():
    g = torch.Generator().manual_seed(0)
    data = [(x, int(y)) for x, y in zip(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g))]
    return autotune.Workload(
        name="tiny", model=lambda: torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)),
        dataset=data, optimizer=lambda p: torch.optim.Adam(p, lr=1e-2),
        loss=lambda m, b: F.cross_entropy(m(b[0]), b[1]), batch_size=16,
    )


def test_hand_written_loop_with_helpers_matches_the_trainer():
    config = autotune.TrainConfig().with_changes({"memory.micro_batch_size": 4, "optimizer.impl": "foreach",
                                                  "data.num_workers": 1, "backend.num_threads": 1})
    wl = _workload()
    reference = Trainer(wl, config, torch.device("cpu"), seed=0).train(4)

    device = torch.device("cpu")
    threads = apply.apply_backend(config, device)
    assert threads == torch.get_num_threads() == 1
    torch.manual_seed(0)
    model, step_model = apply.prepare_model(wl.model(), config)
    optimizer = apply.set_optimizer_impl(wl.optimizer(model.parameters()), config)
    assert all(g["foreach"] for g in optimizer.param_groups)
    sampler = torch.utils.data.RandomSampler(wl.dataset, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(wl.dataset, batch_size=16, sampler=sampler, drop_last=True,
                        generator=torch.Generator().manual_seed(1), **apply.dataloader_kwargs(config))
    losses = []
    for _, batch in zip(range(4), loader):
        batch = apply.to_device(batch, config, device)
        total = 0.0
        micros = apply.micro_batches(batch, config, 16)
        assert len(micros) == apply.accumulation_steps(config, 16) == 4
        for micro in micros:
            with apply.autocast(config, device):
                loss = wl.loss(step_model, micro) / len(micros)
            loss.backward()
            total += float(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
    torch.set_num_threads(apply.default_threads())
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference), rtol=1e-5, atol=1e-6)
