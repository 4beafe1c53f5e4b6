"""GPU utilisation and memory of one attempt, from NVML's per-process accounting where the driver offers it.

NVML keeps, per GPU and while accounting mode is on (``nvidia-smi -am 1``, an admin's setting), the
utilisation and peak memory of every process that used it. An attempt's GPUs are its own (allocated
exclusively), so every process NVML recorded on them since the attempt started was the attempt's. Where
the driver has no accounting (the fake NVML here, accounting mode off, a GPU without support) the answer
is None and gacct shows no GPU figures, rather than invented ones.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import pynvml

log = logging.getLogger("garrison.agent.gpu")


@dataclass(frozen=True, slots=True)
class GpuUsage:
    utilization_pct: float  # mean over the attempt's GPUs of their processes' mean utilisation
    memory_bytes: int  # the largest peak memory of any one of its processes


def attempt_gpu_usage(gpu_indices: Sequence[int], started_at: float) -> GpuUsage | None:
    """Per-process accounting of the attempt's GPUs since ``started_at`` (epoch seconds); None where NVML
    has none to give."""
    if not gpu_indices:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        utilizations: list[float] = []
        peak = 0
        for index in gpu_indices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            if pynvml.nvmlDeviceGetAccountingMode(handle) != pynvml.NVML_FEATURE_ENABLED:
                return None
            per_process: list[float] = []
            for pid in pynvml.nvmlDeviceGetAccountingPids(handle):
                stats = pynvml.nvmlDeviceGetAccountingStats(handle, pid)
                if stats.startTime / 1e6 < started_at:  # microseconds; a process of an earlier job
                    continue
                per_process.append(float(stats.gpuUtilization))
                peak = max(peak, int(stats.maxMemoryUsage))
            utilizations.append(sum(per_process) / len(per_process) if per_process else 0.0)
        return GpuUsage(utilization_pct=sum(utilizations) / len(utilizations), memory_bytes=peak)
    except (pynvml.NVMLError, AttributeError) as exc:  # AttributeError: a pynvml without these calls
        log.debug("no GPU accounting for GPUs %s: %s", list(gpu_indices), exc)
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
