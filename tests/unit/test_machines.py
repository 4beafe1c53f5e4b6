"""The shared machine descriptions: parsing, with one-line errors naming file and key; and the inventory
the simulator builds for a described machine, which must be exactly what the agent's real discovery path
reports on it (discovery over the fake NVML library, under the real pynvml)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import psutil
import pynvml
import pytest

from garrison.machines import (
    TOPOLOGY_NAMES,
    load_description,
    machine_inventory,
    read_machine,
    resolve_topology,
)
from garrison.machines.description import NVML_MAX_NVLINK_LINKS
from garrison.nodeagent.gpu.discovery import discover
from garrison.nodeagent.gpu.fake_nvml import install_fake_nvml, uninstall_fake_nvml

SMALL_MACHINE = """\
name = "two GPUs, one bridge"
numa = [{id=0, cpus="0-3"}]
defaults = {gpu_name = "Test GPU", memory_mib = 1024, max_links = 2, nvlink_version = 3}
gpus = [
  {index=0, bus="00000000:01:00.0", numa=0, pcie_switch="sw0", host_bridge="hb0"},
  {index=1, bus="00000000:02:00.0", numa=0, pcie_switch="sw0", host_bridge="hb0"},
]
nvlink_pairs = [[0,1,2]]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "machine.toml"
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def no_fake_left_behind() -> Iterator[None]:
    uninstall_fake_nvml()
    yield
    uninstall_fake_nvml()


# -- machine descriptions -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TOPOLOGY_NAMES)
def test_builtin_topology_names_resolve_to_bundled_descriptions(name: str) -> None:
    path = resolve_topology(name)
    assert path.is_file()
    assert path.parent.name == "topologies"
    assert path.parent.parent.name == "machines"  # shipped inside the package, not read from elsewhere
    assert load_description(path)["gpus"]


def test_a_description_file_path_resolves_to_itself(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL_MACHINE)
    assert resolve_topology(str(path)) == path
    assert load_description(path)["name"] == "two GPUs, one bridge"


def test_unknown_topology_name_lists_the_valid_names_on_one_line() -> None:
    with pytest.raises(ValueError) as caught:
        resolve_topology("dgx-h100")
    message = str(caught.value)
    assert "\n" not in message
    assert "dgx-h100" in message
    for name in TOPOLOGY_NAMES:
        assert name in message


def test_malformed_toml_names_the_file_on_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "broken"\ngpus = [{index=0, bus=}]\n')
    with pytest.raises(ValueError) as caught:
        load_description(path)
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message
    assert "invalid TOML" in message


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ValueError, match=re.escape(str(path))):
        load_description(path)


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('bus="00000000:02:00.0"', 'bus="02:00"', "gpus[1].bus"),
        ('bus="00000000:02:00.0"', 'bus="00000000:01:00.0"', "gpus[1].bus"),
        ("{index=1,", "{index=5,", "gpus[1].index"),
        (
            '{index=0, bus="00000000:01:00.0", numa=0',
            '{index=0, bus="00000000:01:00.0", numa=4',
            "gpus[0].numa",
        ),
        ('cpus="0-3"', 'cpus="3-0"', "numa[0].cpus"),
        ('cpus="0-3"', 'cpus="all"', "numa[0].cpus"),
        ("memory_mib = 1024", 'memory_mib = "lots"', "defaults.memory_mib"),
        ("[[0,1,2]]", "[[0,1,3]]", "nvlink_pairs"),
        ("[[0,1,2]]", "[[0,7,1]]", "nvlink_pairs[0][1]"),
        ("[[0,1,2]]", "[[0,1]]", "nvlink_pairs[0]"),
        ("nvlink_pairs", "nvlink_pair", "nvlink_pair"),
        (
            'pcie_switch="sw0", host_bridge="hb0"},\n  {index=1',
            'pcie_swtch="sw0"},\n  {index=1',
            "gpus[0].pcie_swtch",
        ),
        ('name = "two GPUs, one bridge"\n', "", "name"),
    ],
)
def test_bad_description_names_file_and_key(tmp_path: Path, old: str, new: str, key: str) -> None:
    assert old in SMALL_MACHINE
    path = write(tmp_path, SMALL_MACHINE.replace(old, new, 1))
    with pytest.raises(ValueError) as caught:
        load_description(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {key}: ")


def test_missing_gpu_list_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "x"\nnuma = []\ndefaults = {gpu_name = "g", memory_mib = 1}\n')
    with pytest.raises(ValueError, match=r": gpus: missing$"):
        load_description(path)


# -- the inventory of a described machine ---------------------------------------------------------------


def test_every_shipped_topology_is_listed() -> None:
    shipped = sorted(path.stem for path in resolve_topology(TOPOLOGY_NAMES[0]).parent.glob("*.toml"))
    assert shipped == sorted(TOPOLOGY_NAMES)


@pytest.mark.parametrize("name", TOPOLOGY_NAMES)
def test_the_shared_builder_gives_what_discovery_reports(name: str) -> None:
    machine = read_machine(name)
    install_fake_nvml(machine, "node07")
    discovered = discover("node07")
    built = machine_inventory(
        machine, "node07", cpus=os.cpu_count() or 1, memory_mb=psutil.virtual_memory().total // (1024 * 1024)
    )
    assert built.gpus, "a shipped machine has GPUs"
    assert built == discovered


def test_the_lane_limit_is_nvmls() -> None:
    assert pynvml.NVML_NVLINK_MAX_LINKS == NVML_MAX_NVLINK_LINKS
