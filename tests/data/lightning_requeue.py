"""A tiny PyTorch Lightning model trained on CPU under ``SLURMEnvironment(auto_requeue=True)``, Lightning unchanged.

Run by tests/e2e/test_slurm_libraries.py as ``srun python lightning_requeue.py ROOT`` from an sbatch script with
``#SBATCH --signal=SIGUSR1@N``. Before the time limit Lightning itself gets SIGUSR1, saves
``ROOT/hpc_ckpt_<n>.ckpt`` and runs ``scontrol requeue $SLURM_JOB_ID``; the job runs again and Lightning, seeing
Slurm (SLURM_NTASKS, a job name other than bash/interactive), resumes from the newest hpc_ckpt in ROOT.

The first run is paced (PACE_S a step) so that it cannot reach MAX_STEPS within its time limit: it is always
interrupted by the warning. A run after a requeue (SLURM_RESTART_COUNT > 0) goes at full speed and finishes.
Each run prints the global step it started from, the one it saved a checkpoint at and the one it finished at.
"""

from __future__ import annotations

import os
import sys
import time

import lightning as L
import torch
from lightning.pytorch.plugins.environments import SLURMEnvironment
from torch.utils.data import DataLoader, TensorDataset

MAX_STEPS = int(os.environ.get("MAX_STEPS", "60"))
PACE_S = float(os.environ.get("PACE_S", "1.0"))
RESTART = int(os.environ.get("SLURM_RESTART_COUNT", "0"))


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def on_train_start(self) -> None:
        print(f"run {RESTART} started at global_step {self.trainer.global_step}", flush=True)

    def on_save_checkpoint(self, checkpoint: dict[str, object]) -> None:
        print(f"run {RESTART} saved global_step {checkpoint['global_step']}", flush=True)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if RESTART == 0:
            time.sleep(PACE_S)  # the first run's work is slow: it outlives its time limit
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    root = sys.argv[1]
    torch.set_num_threads(1)  # a tiny model: threads would only fight over a busy machine's cores
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, num_nodes=1, max_steps=MAX_STEPS, default_root_dir=root,
        plugins=[SLURMEnvironment(auto_requeue=True)], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Tiny(), data)  # no ckpt_path: under Slurm Lightning resumes from ROOT's hpc_ckpt by itself
    print(f"run {RESTART} finished at global_step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
