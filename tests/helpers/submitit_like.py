"""What submitit reads from sacct, restated for the tests that check Garrison's sacct against it (the
submitit dependency is not ours to add): tests/unit/test_slurm_read.py and tests/e2e/test_slurm_read.py."""

from __future__ import annotations

import re


def read_info_like_submitit(text: str) -> dict[str, dict[str, str]]:
    """submitit 1.5.4, submitit/slurm/slurm.py: SlurmInfoWatcher.read_info and read_job_id, restated (the
    submitit dependency is not ours to add): '|'-split lines under the header, ids with a '.' skipped,
    ``A_[0-3]`` ranges spread over their tasks."""
    lines = text.splitlines()
    if len(lines) < 2:
        return {}
    names = lines[0].split("|")
    all_stats: dict[str, dict[str, str]] = {}
    for line in lines[1:]:
        stats = {x: y.strip() for x, y in zip(names, line.split("|"), strict=False)}
        job_id = stats["JobID"]
        if not job_id or "." in job_id:
            continue
        match = re.search(r"(?P<main_id>\d+)_\[(?P<arrays>(\d+(-\d+)?(,)?)+)(\%\d+)?\]", job_id)
        if match:
            parts = [tuple([match.group("main_id"), *r.split("-")]) for r in match.group("arrays").split(",")]
        else:
            main_id, *array_id = job_id.split("_", 1)
            parts = [(main_id,)] if not array_id else [(main_id, str(int(array_id[0])))]
        for split_job_id in parts:
            all_stats["_".join(split_job_id[:2])] = stats
            if len(split_job_id) >= 3:
                for index in range(int(split_job_id[1]), int(split_job_id[2]) + 1):
                    all_stats[f"{split_job_id[0]}_{index}"] = stats
    return all_stats
