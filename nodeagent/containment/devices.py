"""The device files a job may open, by the agent's job_devices policy.

"gpus" (the default, Slurm's ConstrainDevices=yes): every device but the node's GPUs the job was not given, so
what a job needs beside its GPUs (InfiniBand's uverbs and rdma_cm for NCCL across nodes, /dev/fuse for
squashfs and enroot images, GPUDirect Storage's nvidia-fs) works as on the host, under the files' own modes.
"allowlist": only its own GPUs, what CUDA needs beside them, and the standard ones; everything else (other
GPUs, disks, InfiniBand, the host's consoles) answers EPERM. Either way the devices cgroup checks the device
number, not the path, so a job cannot get around it with mknod.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

NVIDIA_MAJOR = 195  # /dev/nvidiaN (minor N), /dev/nvidiactl (255), /dev/nvidia-modeset (254)
NVIDIACTL_MINOR = 255
NVIDIA_MODESET_MINOR = 254

# (type, major, minor or "*") a process needs whatever it runs: the same set container runtimes allow.
STANDARD_DEVICES: tuple[tuple[str, int, int | str], ...] = (
    ("c", 1, 3),  # /dev/null
    ("c", 1, 5),  # /dev/zero
    ("c", 1, 7),  # /dev/full
    ("c", 1, 8),  # /dev/random
    ("c", 1, 9),  # /dev/urandom
    ("c", 5, 0),  # /dev/tty
    ("c", 5, 2),  # /dev/ptmx
    ("c", 136, "*"),  # /dev/pts/*
)
# Drivers with a dynamic major: the GPU's unified memory, its tools and (MIG) capabilities.
DYNAMIC_NVIDIA_DRIVERS = ("nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps")


def dynamic_majors(proc_devices: Path = Path("/proc/devices"), dev: Path = Path("/dev")) -> set[int]:
    """Majors of nvidia-uvm & co., from /proc/devices (driver loaded) or the device nodes that exist."""
    majors: set[int] = set()
    try:
        for line in proc_devices.read_text().splitlines():
            number, _, name = line.strip().partition(" ")
            if number.isdigit() and name.strip() in DYNAMIC_NVIDIA_DRIVERS:
                majors.add(int(number))
    except OSError:
        pass
    for path in dev.glob("nvidia-uvm*"):
        try:
            info = path.stat()
        except OSError:
            continue
        if stat.S_ISCHR(info.st_mode):
            majors.add(os.major(info.st_rdev))
    return majors


def denied_gpus(other_gpu_minors: Iterable[int]) -> list[str]:
    """devices.deny lines for the "gpus" policy: the node's GPUs the job was not given (read, write, mknod)."""
    return [f"c {NVIDIA_MAJOR}:{minor} rwm" for minor in sorted(set(other_gpu_minors))]


def allowed_devices(gpu_minors: Iterable[int], uvm_majors: Iterable[int]) -> list[str]:
    """devices.allow lines: mknod of anything (opening is what is checked), the standard character
    devices, the allocated GPUs, and the NVIDIA control devices CUDA opens."""
    lines = ["c *:* m", "b *:* m"]
    lines += [f"{kind} {major}:{minor} rwm" for kind, major, minor in STANDARD_DEVICES]
    minors = set(gpu_minors)
    lines += [f"c {NVIDIA_MAJOR}:{minor} rwm" for minor in sorted(minors)]
    if minors:  # a job without GPUs needs none of the driver's devices either
        lines += [f"c {NVIDIA_MAJOR}:{NVIDIACTL_MINOR} rwm", f"c {NVIDIA_MAJOR}:{NVIDIA_MODESET_MINOR} rwm"]
        lines += [f"c {major}:* rwm" for major in sorted(set(uvm_majors))]
    return lines
