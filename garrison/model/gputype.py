"""The one rule for matching a requested GPU type (``--gpus a100:2``, ``--gres=gpu:A100:4``) against a GPU's
product name as NVML reports it ("NVIDIA A100-SXM4-80GB"). Pure; the controller's validation and the
scheduling core both use it."""

from __future__ import annotations

import re

_SEPARATORS = re.compile(r"[\s_-]+")


def normalized_gpu_name(name: str) -> str:
    """Lower case, with runs of spaces, ``_`` and ``-`` as one space: "NVIDIA A100-SXM4-80GB" ->
    "nvidia a100 sxm4 80gb"."""
    return _SEPARATORS.sub(" ", name.strip().lower()).strip()


def gpu_matches(gpu_name: str, gpu_type: str | None) -> bool:
    """Whether a GPU named ``gpu_name`` is of the requested ``gpu_type`` (None matches every GPU).

    Case-insensitive, with ``-``, ``_`` and spaces equivalent, and matching whole words of the name from
    any word on: ``a100``, ``A100``, ``a100-sxm4-80gb``, ``nvidia_a100`` all match "NVIDIA A100-SXM4-80GB";
    ``a10`` does not (it is another GPU), nor does ``100``. This is how Slurm's AutoDetect names are used.
    Words may also be run together as sites name their types: ``rtx8000`` is "Quadro RTX 8000".
    """
    if gpu_type is None:
        return True
    wanted = normalized_gpu_name(gpu_type)
    if not wanted:
        return False
    name = normalized_gpu_name(gpu_name)
    words = f" {name} "
    if f" {wanted} " in words:
        return True
    name_words = name.split()
    # Sites name types with the words run together (--gres=gpu:rtx8000:1, gtx1080ti, titanrtx): a request
    # without separators matches a run of whole words of the name spelled without theirs.
    squashed = wanted.replace(" ", "")
    for first in range(len(name_words)):
        run = ""
        for word in name_words[first:]:
            run += word
            if run == squashed:
                return True
            if not squashed.startswith(run):
                break
    # A request may name a prefix of a word sequence when the rest is a size or form suffix
    # ("a100 80gb" is not contiguous in "a100 sxm4 80gb"): every requested word must be a word of the name, in order.
    wanted_words = wanted.split()
    position = 0
    for word in wanted_words:
        try:
            position = name_words.index(word, position) + 1
        except ValueError:
            return False
    return True


# Words of a product name that say who sells the GPU or its line, not which GPU it is.
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro", "amd", "instinct", "radeon"}


def slurm_gpu_type(name: str) -> str:
    """The short type name Slurm's gres.conf usually gives a GPU, for ``gpu:TYPE:N`` (sinfo %G):
    "NVIDIA A100-SXM4-80GB" -> "a100", "Tesla V100-SXM2-16GB" -> "v100", "NVIDIA RTX A6000" -> "rtx_a6000".

    The name's words without the vendor's, up to and including the first word with a digit (the model),
    joined with ``_``; ``gpu_matches`` matches the result against the name it came from. "" for no name."""
    words = [w for w in normalized_gpu_name(name).split() if w not in _VENDOR_WORDS]
    chosen: list[str] = []
    for word in words:
        chosen.append(word)
        if any(ch.isdigit() for ch in word):
            break
    return "_".join(chosen)
