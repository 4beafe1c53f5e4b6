"""BinPack: prefer the node left with the fewest free GPUs, so that whole nodes stay free for big gangs
(fragmentation-aware best fit)."""

from __future__ import annotations

from garrison.controller.sched.framework import Candidate, Request


class BinPack:
    name = "BinPack"

    def __init__(self, weight: int = 3) -> None:
        self.weight = weight

    def score(self, request: Request, candidate: Candidate, gpus: tuple[int, ...]) -> int:
        total = len(candidate.view.gpu_names)  # NodeView.gpu_count, without the property call
        if total == 0:
            return 100
        left = max(0, len(candidate.usable) - len(gpus))
        return round(100 * (total - left) / total)
