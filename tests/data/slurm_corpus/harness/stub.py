#!/usr/bin/env python3
"""Stands in for the training program of a corpus script (tests/e2e/test_slurm_corpus.py): it joins the
process group its launcher described, does one real gloo all_reduce, and records what it got.

How it finds its rank is the program's, chosen by CORPUS_MODE:
- ``torch`` (the default): torch's env:// variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK),
  as torchrun, accelerate, deepspeed and srun set them; without RANK it is a single process.
- ``slurm``: what PyTorch Lightning's SLURMEnvironment reads inside an srun task (SLURM_PROCID, SLURM_NTASKS,
  SLURM_LOCALID, MASTER_ADDR or the first node of SLURM_NODELIST, MASTER_PORT or 15000 + the job id's last
  four digits).

It writes CORPUS_RESULTS/<job>/rank-<N>.json; the test checks the records against the script's directives.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
from pathlib import Path


def first_host(nodelist: str) -> str:
    """The first name of a Slurm host list (``node[1-4],gpu7`` -> ``node1``)."""
    match = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?", nodelist)
    assert match is not None
    prefix, ranges = match.group(1), match.group(2)
    if ranges is None:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def local_rank_argument(argv: list[str]) -> int | None:
    """torch.distributed.launch's ``--local-rank=N`` (or ``--local_rank N``) argument, if given."""
    for index, word in enumerate(argv):
        for flag in ("--local-rank", "--local_rank"):
            if word.startswith(flag + "="):
                return int(word.split("=", 1)[1])
            if word == flag and index + 1 < len(argv):
                return int(argv[index + 1])
    return None


def main() -> int:
    env = os.environ
    mode = env.get("CORPUS_MODE", "torch")
    if mode == "slurm":
        rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        local_rank = int(env["SLURM_LOCALID"])
        addr = env.get("MASTER_ADDR") or first_host(env["SLURM_NODELIST"])
        port = int(env.get("MASTER_PORT") or 15000 + int(env["SLURM_JOB_ID"][-4:]))
    elif "RANK" in env:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(env["LOCAL_RANK"])
        addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    else:
        rank, world, local_rank, addr, port = 0, 1, 0, "", 0
    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=90)
    if world == 1 and not addr:
        store: dist.Store = dist.HashStore()
        dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timeout)
    else:
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
                                timeout=timeout)
    value = torch.tensor([float(rank)])
    dist.all_reduce(value)
    dist.barrier()
    dist.destroy_process_group()
    job = env.get("SLURM_JOB_ID", "none")
    if env.get("SLURM_ARRAY_TASK_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    record = {
        "program": sys.argv[0], "argv": sys.argv[1:], "mode": mode, "rank": rank, "world": world,
        "local_rank": local_rank, "local_rank_argument": local_rank_argument(sys.argv[1:]),
        "local_world": env.get("LOCAL_WORLD_SIZE"), "addr": addr, "port": port, "sum": value.item(),
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"), "node": env.get("SLURMD_NODENAME"),
        "job": job, "procid": env.get("SLURM_PROCID"), "cwd": os.getcwd(),
    }
    out = Path(env["CORPUS_RESULTS"]) / job
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{rank}.json").write_text(json.dumps(record))
    print(f"stub: rank {rank} of {world} on {record['node']}: all_reduce {value.item()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
