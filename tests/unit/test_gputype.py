"""The GPU type rule (garrison.model.gputype): one rule for validation and the scheduling core."""

from __future__ import annotations

import pytest

from garrison.model.gputype import gpu_matches, normalized_gpu_name

A100 = "NVIDIA A100-SXM4-80GB"
V100 = "Tesla V100-SXM2-16GB"


@pytest.mark.parametrize(
    "wanted", ["a100", "A100", "a100-sxm4-80gb", "A100-SXM4-80GB", "nvidia_a100", "a100_80gb", A100, " a100 "]
)
def test_usual_names_match(wanted: str) -> None:
    assert gpu_matches(A100, wanted)


@pytest.mark.parametrize("wanted", ["a10", "100", "h100", "a100-pcie", "v100", "", "-"])
def test_other_names_do_not_match(wanted: str) -> None:
    assert not gpu_matches(A100, wanted)


def test_none_matches_every_gpu_and_other_vendors_names_work() -> None:
    assert gpu_matches(A100, None)
    assert gpu_matches(V100, "v100") and gpu_matches(V100, "V100-SXM2") and not gpu_matches(V100, "a100")


def test_normalized_name() -> None:
    assert normalized_gpu_name("  NVIDIA  A100_SXM4--80GB ") == "nvidia a100 sxm4 80gb"


def test_the_core_and_validation_use_the_same_rule() -> None:
    from garrison.controller import validate
    from garrison.controller.sched import placement

    assert placement.gpu_matches is gpu_matches and validate.gpu_matches is gpu_matches


@pytest.mark.parametrize("name,wanted", [
    ("Quadro RTX 8000", "rtx8000"), ("NVIDIA GeForce GTX 1080 Ti", "gtx1080ti"), ("NVIDIA GeForce RTX 2080 Ti", "2080ti"),
    ("NVIDIA TITAN RTX", "titanrtx"), ("NVIDIA GeForce RTX 3090", "rtx3090"), ("Quadro RTX 6000", "RTX6000"),
])
def test_site_names_with_the_words_run_together_match(name: str, wanted: str) -> None:
    # --gres=gpu:rtx8000:1 as NYU's and other sites' scripts write it; never part of a word ("rtx80").
    assert gpu_matches(name, wanted)
    assert not gpu_matches(name, wanted[:-1]) and not gpu_matches(A100, "a10080gb")
