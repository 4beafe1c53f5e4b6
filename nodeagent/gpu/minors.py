"""Which /dev/nvidiaN belongs to which GPU: NVML's minor number of each device.

A GPU's NVML index and its device file's minor number usually agree, but need not (the index follows PCI
order, the minor the driver's probe order), and the devices cgroup allows device numbers, not indices. The
agent asks once at start; a GPU NVML cannot answer for keeps its index.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import pynvml


def device_minors(indices: Iterable[int]) -> dict[int, int]:
    """GPU index -> the minor number of its /dev/nvidiaN."""
    wanted = list(indices)
    found = {index: index for index in wanted}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return found
    try:
        for index in wanted:
            with contextlib.suppress(pynvml.NVMLError):
                found[index] = int(pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(index)))
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return found
