"""A torchrun worker that checkpoints on SIGUSR1 (tests/e2e/test_torchrun_signals.py).

Every step all-reduces over gloo. SIGUSR1 only sets a flag; at the next step the workers agree (an all_reduce
of the flags), rank 0 saves the step into GARRISON_CHECKPOINT_DIR, and all exit 0. Started again with a
checkpoint, it resumes there, runs five more steps and exits 0. Each worker records its pid and its parent's
(the torchrun agent's) in RECORDS/pids-<attempt>-<rank>, and rank 0 its progress in RECORDS/progress-<attempt>.
With REQUEUE_ON_WARNING set, rank 0 requeues the job after saving (gcontrol requeue), as Lightning does.
"""

import json
import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist

warned = [False]
signal.signal(signal.SIGUSR1, lambda signum, frame: warned.__setitem__(0, True))

records = sys.argv[1]
attempt = os.environ["GARRISON_ATTEMPT"]
checkpoint_dir = os.environ["GARRISON_CHECKPOINT_DIR"]
checkpoint = os.path.join(checkpoint_dir, "ckpt.json")

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
with open(os.path.join(records, f"pids-{attempt}-{rank}"), "w") as pids:
    pids.write(f"{os.getpid()} {os.getppid()}\n")

start = 0
if os.path.exists(checkpoint):
    with open(checkpoint) as saved:
        start = json.load(saved)["step"]
    if rank == 0:
        print(f"resumed at step {start}", flush=True)
step = start
while True:
    flags = torch.tensor([1.0 if warned[0] else 0.0])
    dist.all_reduce(flags)
    if flags.item() > 0:
        if rank == 0:
            os.makedirs(checkpoint_dir, exist_ok=True)
            with open(checkpoint + ".tmp", "w") as saved:
                json.dump({"step": step}, saved)
            os.replace(checkpoint + ".tmp", checkpoint)
            print(f"checkpointed at step {step}", flush=True)
            if os.environ.get("REQUEUE_ON_WARNING"):
                # As Lightning's auto_requeue calls `scontrol requeue`. The requeue's SIGTERM may end us before
                # gcontrol has answered: the job is requeued all the same.
                print("requeueing itself", flush=True)
                subprocess.run(["gcontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=True)
        dist.barrier()
        dist.destroy_process_group()
        sys.exit(0)
    if start > 0 and step >= start + 5:
        if rank == 0:
            print(f"finished at step {step}", flush=True)
        dist.destroy_process_group()
        sys.exit(0)
    ones = torch.ones(1)
    dist.all_reduce(ones)
    assert ones.item() == world
    step += 1
    if rank == 0:
        with open(os.path.join(records, f"progress-{attempt}"), "w") as progress:
            progress.write(str(step))
    time.sleep(0.1)
