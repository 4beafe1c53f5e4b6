"""What the controller adds for Slurm's variables: the array's index set, the checked submit host, the
cluster's name (the agent's side is test_launch_env.py)."""

from __future__ import annotations

import pytest

from garrison.config import ControllerConfig
from garrison.config.errors import ConfigError
from garrison.config.sections import read_controller
from garrison.controller.engine import with_array_summary
from garrison.controller.validate import ValidationError, validate_submission
from garrison.model.domain import JobSpec, Principal

ALICE = Principal("alice", 1000, 1000, (1000,))
SPEC = JobSpec(name="t", command=("true",), workdir="/home/alice")


@pytest.mark.parametrize(("indices", "summary"), [
    ([1, 2, 3, 4], (4, 1, 4, 1)),
    ([7, 1, 3, 5], (4, 1, 7, 2)),  # 1-7:2, in any order
    ([0, 1, 5], (3, 0, 5, 1)),  # unevenly spaced: step 1
    ([9], (1, 9, 9, 1)),
])
def test_array_tasks_carry_their_arrays_index_set(indices: list[int], summary: tuple[int, int, int, int]) -> None:
    spec = with_array_summary(SPEC, indices)
    assert (spec.array_task_count, spec.array_task_min, spec.array_task_max, spec.array_task_step) == summary


@pytest.mark.parametrize("host", ["login1", "login-1.example.org", "a"])
def test_a_host_name_is_a_valid_submit_host(host: str) -> None:
    from dataclasses import replace

    resolved = validate_submission(replace(SPEC, submit_host=host), ALICE, ControllerConfig(), {}, [])
    assert resolved.spec.submit_host == host


@pytest.mark.parametrize("host", ["", "-x", "a b", "x\nSLURM_JOB_ID=1", "h" * 300, "node1;rm"])
def test_anything_else_as_submit_host_is_refused(host: str) -> None:
    from dataclasses import replace

    with pytest.raises(ValidationError, match="submit host must be a host name") as caught:
        validate_submission(replace(SPEC, submit_host=host), ALICE, ControllerConfig(), {}, [])
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 160


def test_cluster_name_is_configured_and_checked() -> None:
    assert ControllerConfig().cluster_name == "garrison"
    assert read_controller({"cluster_name": "tiny-1"}, "controller").cluster_name == "tiny-1"
    with pytest.raises(ConfigError, match="cluster_name"):
        read_controller({"cluster_name": "two words"}, "controller")


@pytest.mark.parametrize("name", ["train-%j", "exp/lr=0.1", "run (v2) [seed 3]", "résumé", "a#b|c", "x" * 128])
def test_a_job_name_may_be_any_text_as_in_slurm(name: str) -> None:
    from dataclasses import replace

    assert validate_submission(replace(SPEC, name=name), ALICE, ControllerConfig(), {}, []).spec.name == name


@pytest.mark.parametrize("name", ["", "   ", "a\nb", "a\x1b[2Jb", "tab\there", "x" * 129])
def test_a_job_name_that_would_corrupt_a_listing_is_refused(name: str) -> None:
    from dataclasses import replace

    with pytest.raises(ValidationError, match="job name must be 1-128 printable characters") as caught:
        validate_submission(replace(SPEC, name=name), ALICE, ControllerConfig(), {}, [])
    assert "\n" not in str(caught.value)
