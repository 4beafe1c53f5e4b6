"""No containment: jobs are tracked by their process groups only (a host without usable cgroups, where the
configuration says allow_unconfined = true)."""

from __future__ import annotations

from garrison.nodeagent.containment.interface import AttemptLimits, Capabilities, CgroupDirs, ControllerCheck


class Unconfined:
    def __init__(self, why: tuple[ControllerCheck, ...] = ()) -> None:
        self._capabilities = Capabilities(kind="unconfined", checks=why)

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    def create(self, name: str, limits: AttemptLimits) -> CgroupDirs | None:
        return None

    def attempt_dirs(self, name: str) -> CgroupDirs | None:
        return None

    def create_child(self, dirs: CgroupDirs, name: str) -> CgroupDirs:
        return dirs

    def destroy(self, dirs: CgroupDirs) -> bool:
        return True
