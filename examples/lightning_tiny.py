"""A LightningModule, tuned as it is: `autotune.integrations.lightning.workload` takes the
module's own training_step, configure_optimizers and train_dataloader. Needs `lightning`
(`pip install 'autotune[lightning]'`).

    autotune profile examples/lightning_tiny.py
    autotune tune examples/lightning_tiny.py --out runs/lightning
    autotune export runs/lightning --to lightning --batch-size 32
"""

from __future__ import annotations

import lightning
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from autotune.integrations.lightning import workload as from_lightning


class TinyClassifier(lightning.LightningModule):
    def __init__(self, dim: int = 32, classes: int = 4, samples: int = 512, batch_size: int = 32):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, classes))
        self.dim, self.classes, self.samples, self.batch_size = dim, classes, samples, batch_size

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.samples, self.dim, generator=g)
        y = torch.randint(0, self.classes, (self.samples,), generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=self.batch_size, shuffle=True)


def workload():
    return from_lightning(TinyClassifier, name="lightning tiny classifier")


def small():
    return workload()
