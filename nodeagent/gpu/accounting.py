"""GPU utilisation and memory of one attempt, from NVML's per-process accounting where the driver offers it.

NVML keeps, per GPU and while accounting mode is on (``nvidia-smi -am 1``, an admin's setting), the
utilisation and peak memory of every process that used it. An attempt's GPUs are its own (allocated
exclusively), so every process NVML recorded on them since the attempt started was the attempt's. Where
the driver has no accounting (the fake NVML here, accounting mode off, a GPU without support) the answer
is None and gacct shows no GPU figures, rather than invented ones.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import pynvml

log = logging.getLogger("garrison.agent.gpu")

# GPUs found without accounting (its mode off, the most common setting, or no support, or no NVML at all),
# each with when to ask again. Every attempt's end asked NVML the same question, with an nvmlInit and an
# nvmlShutdown around it: 60 us a job with the fake library, milliseconds with a real driver where no
# persistence daemon keeps it loaded. An admin who turns accounting on (nvidia-smi -am 1) is seen within this.
NO_ACCOUNTING_RECHECK_S = 300.0
_no_accounting_until: dict[int, float] = {}


def _without_accounting(indices: Sequence[int], now: float) -> None:
    until = now + NO_ACCOUNTING_RECHECK_S
    for index in indices:
        _no_accounting_until[index] = until


@dataclass(frozen=True, slots=True)
class GpuUsage:
    utilization_pct: float  # mean over the attempt's GPUs of their processes' mean utilisation
    memory_bytes: int  # the largest peak memory of any one of its processes


def attempt_gpu_usage(gpu_indices: Sequence[int], started_at: float) -> GpuUsage | None:
    """Per-process accounting of the attempt's GPUs since ``started_at`` (epoch seconds); None where NVML
    has none to give."""
    if not gpu_indices:
        return None
    now = time.monotonic()
    if any(_no_accounting_until.get(index, 0.0) > now for index in gpu_indices):  # None for such an attempt
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        _without_accounting(gpu_indices, now)
        return None
    try:
        utilizations: list[float] = []
        peak = 0
        for index in gpu_indices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                enabled = pynvml.nvmlDeviceGetAccountingMode(handle) == pynvml.NVML_FEATURE_ENABLED
            except (pynvml.NVMLError, AttributeError):  # no support (the fake library), or an old pynvml
                enabled = False
            if not enabled:
                _without_accounting([index], now)
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
