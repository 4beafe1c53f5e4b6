#!/usr/bin/env python3
"""CPU to remove an acknowledged attempt's job directory (nodeagent/jobfiles.py remove_tree) against
shutil.rmtree, alternating. A script, not a test: prints `key: value` lines.

    python tests/benchmarks/job_dir_removal.py [--dirs 1000] [--rounds 3] [--base DIR]

Each round makes --dirs directories as a finished trivial attempt leaves them (the script, launch.json,
supervisor.lock, supervisor.pid, status.json and an empty user/ directory), then removes them with one
function and times the process's CPU (user + system) per directory; the two alternate, round by round.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from garrison.nodeagent.jobfiles import remove_tree

FILES = ("script", "launch.json", "supervisor.lock", "supervisor.pid", "status.json")


def make(base: Path, count: int) -> list[str]:
    made = []
    for index in range(count):
        directory = base / f"{index}.0"
        directory.mkdir(mode=0o711)
        (directory / "user").mkdir(mode=0o700)
        for name in FILES:
            (directory / name).write_bytes(b"x" * 300)
        made.append(str(directory))
    return made


def per_directory_us(remove: Callable[[str], None], base: Path, count: int) -> float:
    directories = make(base, count)
    started = time.process_time()
    for directory in directories:
        remove(directory)
    return (time.process_time() - started) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dirs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", default=None, help="where to make them (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.base) as scratch:
        base = Path(scratch)
        figures: dict[str, list[float]] = {"rmtree": [], "remove_tree": []}
        for _ in range(args.rounds):
            figures["rmtree"].append(per_directory_us(lambda p: shutil.rmtree(p, ignore_errors=True), base, args.dirs))
            figures["remove_tree"].append(per_directory_us(remove_tree, base, args.dirs))
            assert not os.listdir(base)
        for name, values in figures.items():
            print(f"{name}_cpu_us_per_dir: {statistics.median(values):.1f} ({', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
