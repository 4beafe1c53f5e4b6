"""Worked example: DDP training that checkpoints when Garrison warns it (SIGUSR1) and resumes after requeue.

    gsub -N 2 --gpus-per-node 4 -q low --signal USR1@60 -t 4:00:00 --wrap 'python ddp_checkpoint.py weights.txt'

- Every rank installs a SIGUSR1 handler that only sets a flag; the ranks agree at the next step boundary
  (an all_reduce of the flag) so they stop at the same step, rank 0 saves model + optimiser + step into
  GARRISON_CHECKPOINT_DIR (the same directory for every attempt of the job), touches
  GARRISON_CHECKPOINT_MARK (what `gcheckpoint` does) and every rank exits 0. Garrison requeues a preempted
  job whatever it exits with, under the same job id, with GARRISON_RESTART_COUNT incremented.
- On start, a checkpoint found in GARRISON_CHECKPOINT_DIR is loaded and training resumes from its step.
- The data of step N is drawn from a generator seeded with N, so an interrupted-and-resumed run ends with
  exactly the same weights as an uninterrupted one (the end-to-end test checks this bit for bit).
- It also checkpoints every CHECKPOINT_EVERY steps and reports it, which makes it a cheaper preemption
  victim: the scheduler prefers victims that lose the least work since their last checkpoint.
Runs on CPU with gloo as well as on GPUs (use backend "nccl" and .cuda() there).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = int(os.environ.get("STEPS", "300"))
STEP_SLEEP_S = float(os.environ.get("STEP_SLEEP_S", "0.02"))  # stands in for real work per step
CHECKPOINT_EVERY = int(os.environ.get("CHECKPOINT_EVERY", "50"))
CHECKPOINT_DIR = os.environ.get("GARRISON_CHECKPOINT_DIR", "checkpoints")
CHECKPOINT = os.path.join(CHECKPOINT_DIR, "ckpt.pt")

warned = False


def on_warning(signum: int, frame: object) -> None:
    global warned
    warned = True  # act at the next step boundary, never inside the handler


def save(model: torch.nn.Module, optimiser: torch.optim.Optimizer, step: int) -> None:
    os.makedirs(CHECKPOINT_DIR, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimiser": optimiser.state_dict(), "step": step}, CHECKPOINT + ".tmp")
    os.replace(CHECKPOINT + ".tmp", CHECKPOINT)  # never leave a torn checkpoint behind
    mark = os.environ.get("GARRISON_CHECKPOINT_MARK")
    if mark:
        with open(mark, "a"):
            pass
        os.utime(mark)


def main() -> None:
    signal.signal(signal.SIGUSR1, on_warning)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank() if distributed else 0

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    start = 0
    if os.path.exists(CHECKPOINT):
        state = torch.load(CHECKPOINT)
        model.load_state_dict(state["model"])
        optimiser.load_state_dict(state["optimiser"])
        start = state["step"]
        print(f"rank {rank}: resumed at step {start} (restart {os.environ.get('GARRISON_RESTART_COUNT')})", flush=True)
    net = DistributedDataParallel(model) if distributed else model

    for step in range(start, STEPS):
        stop = torch.tensor([1.0 if warned else 0.0])
        if distributed:
            dist.all_reduce(stop)  # every rank stops at the same step if any was warned
        if stop.item() > 0:
            if rank == 0:
                save(model, optimiser, step)
                print(f"rank 0: checkpointed at step {step}, exiting for requeue", flush=True)
            if distributed:
                dist.barrier()
                dist.destroy_process_group()
            sys.exit(0)
        if rank == 0 and step and step % CHECKPOINT_EVERY == 0:
            save(model, optimiser, step)
        batch = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(16, 8, generator=batch)
        loss = torch.nn.functional.mse_loss(net(x), x.sum(dim=1, keepdim=True))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        time.sleep(STEP_SLEEP_S)

    if rank == 0:
        out = sys.argv[1] if len(sys.argv) > 1 else "weights.txt"
        with open(out, "w") as fh:
            fh.write(repr([p.detach().flatten().tolist() for p in model.parameters()]) + "\n")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
