"""What an attempt used, as sacct and seff show it: MaxRSS, TotalCPU, CPU efficiency, GPU utilisation and
GPU memory. Pure formatting of a ContainmentUsage message (or None); "-" where nothing was measured (an
unconfined node, a job still running, a driver without GPU accounting)."""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: gqueue and gjob import this module, and typing costs ~5 ms
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

NOT_MEASURED = "-"


def measured(usage: Any | None) -> Any | None:
    """The message if it holds any figure, else None (an unset submessage reads as all-empty). A plain
    message (garrison/plainmsg.py) holds a sub-message only where it was set."""
    if usage is None or (hasattr(usage, "ListFields") and not usage.ListFields()):
        return None
    return usage


def format_bytes(value: int) -> str:
    """sacct's memory figures: 512K, 300.25M, 1.50G."""
    if value < 1 << 20:
        return f"{value / 1024:.0f}K"
    if value < 1 << 30:
        return f"{value / (1 << 20):.2f}M"
    return f"{value / (1 << 30):.2f}G"


def format_cpu_time(seconds: float) -> str:
    """sacct's TotalCPU: MM:SS.mmm under an hour, else [D-]HH:MM:SS."""
    if seconds < 3600:
        minutes, rest = divmod(seconds, 60)
        return f"{int(minutes):02d}:{rest:06.3f}"
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}" if days else f"{hours:02d}:{minutes:02d}:{secs:02d}"


def cpu_efficiency_pct(usage: Any | None, elapsed_s: float, cpus: int) -> float | None:
    """seff's CPU efficiency: CPU time over the allocated CPUs' wall time. None without CPUs or figures."""
    usage = measured(usage)
    if usage is None or not usage.HasField("cpu_time_s") or cpus <= 0 or elapsed_s <= 0:
        return None
    return 100.0 * usage.cpu_time_s / (elapsed_s * cpus)


def usage_cells(usage: Any | None, elapsed_s: float, cpus: int) -> tuple[str, str, str, str, str]:
    """MAXRSS, TOTALCPU, CPUEFF, GPUUTIL, GPUMEM for a table row."""
    usage = measured(usage)
    if usage is None:
        return (NOT_MEASURED,) * 5  # type: ignore[return-value]
    efficiency = cpu_efficiency_pct(usage, elapsed_s, cpus)
    return (
        format_bytes(usage.max_rss_bytes) if usage.HasField("max_rss_bytes") else NOT_MEASURED,
        format_cpu_time(usage.cpu_time_s) if usage.HasField("cpu_time_s") else NOT_MEASURED,
        f"{efficiency:.1f}%" if efficiency is not None else NOT_MEASURED,
        f"{usage.gpu_utilization_pct:.1f}%" if usage.HasField("gpu_utilization_pct") else NOT_MEASURED,
        format_bytes(usage.gpu_memory_bytes) if usage.HasField("gpu_memory_bytes") else NOT_MEASURED,
    )


def attempt_usage_json(usage: Any | None, elapsed_s: float, cpus: int) -> dict[str, Any] | None:
    usage = measured(usage)
    if usage is None:
        return None
    efficiency = cpu_efficiency_pct(usage, elapsed_s, cpus)
    return {
        "max_rss_bytes": usage.max_rss_bytes if usage.HasField("max_rss_bytes") else None,
        "total_cpu_s": round(usage.cpu_time_s, 6) if usage.HasField("cpu_time_s") else None,
        "cpu_efficiency_pct": round(efficiency, 2) if efficiency is not None else None,
        "gpu_utilization_pct": usage.gpu_utilization_pct if usage.HasField("gpu_utilization_pct") else None,
        "gpu_memory_bytes": usage.gpu_memory_bytes if usage.HasField("gpu_memory_bytes") else None,
        "oom_kills": usage.oom_kills,
    }


def usage_line(usage: Any | None, elapsed_s: float, cpus: int) -> str:
    """gjob's line: MaxRSS=300.25M TotalCPU=00:01.234 CPUEff=87.5% GPUUtil=- GPUMem=-."""
    names: Sequence[str] = ("MaxRSS", "TotalCPU", "CPUEff", "GPUUtil", "GPUMem")
    cells = usage_cells(usage, elapsed_s, cpus)
    return " ".join(f"{name}={cell}" for name, cell in zip(names, cells, strict=True))
