"""garrison up's block in /etc/hosts: each fake node's name and its own loopback address, so that scripts
taking MASTER_ADDR from the node list (``scontrol show hostnames``, ``$SLURM_NODELIST``) resolve it.

One marked block per local cluster, keyed by its state dir, so that clusters up at once (tests run in
parallel) never clobber each other's. Node ``nodeN`` of every cluster has the same address, 127.0.1.N (all
of 127/8 is loopback on Linux, so it is usable with no further set-up), so the blocks never disagree. A
line another block already has is kept commented out (``#also``): the resolver returns every matching line,
and ``hostname -i`` printing ``127.0.1.3 127.0.1.3`` breaks scripts that take MASTER_ADDR from it; when the
block holding the live line goes, the next block's copy is made live again. The file is rewritten under an
advisory lock and replaced atomically: resolvers read it at any moment.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

HOSTS_FILE = Path("/etc/hosts")
BEGIN = "# BEGIN garrison local cluster "
END = "# END garrison local cluster "
ALSO = "#also "  # a line another block has live


def node_address(index: int) -> str:
    """The loopback address of a local cluster's ``node{index}`` (1-based; garrison up has at most 64)."""
    if not 1 <= index <= 254:
        raise ValueError(f"node index {index} out of range 1-254")
    return f"127.0.1.{index}"


def _key(state_dir: Path) -> str:
    # A line of its own: a newline in the path must not end the marker.
    return str(state_dir).replace("\n", "?").replace("\r", "?")


def edit_block(text: str, state_dir: Path, entries: Sequence[tuple[str, str]]) -> str:
    """``text`` without this cluster's block, then (if ``entries``, (address, name) pairs) a fresh block at
    the end. Everything else, other clusters' blocks included, is kept as it was."""
    begin, end = BEGIN + _key(state_dir), END + _key(state_dir)
    kept: list[str] = []
    inside = False
    for line in text.splitlines(keepends=True):
        stripped = line.rstrip("\r\n")
        if stripped == begin:
            inside = True
        elif inside and stripped == end:
            inside = False
        elif not inside:
            kept.append(line)
    if kept and not kept[-1].endswith("\n"):
        kept[-1] += "\n"
    if entries:
        kept.append(begin + "\n")
        kept.extend(f"{address} {name}\n" for address, name in entries)
        kept.append(end + "\n")
    return _one_live_copy(kept)


def _one_live_copy(lines: list[str]) -> str:
    """The garrison blocks' lines, each live in the first block that has it and ``#also`` in the others."""
    out: list[str] = []
    live: set[str] = set()
    inside = False
    for line in lines:
        stripped = line.rstrip("\r\n")
        if stripped.startswith(BEGIN):
            inside = True
        elif stripped.startswith(END):
            inside = False
        elif inside and stripped:
            entry = stripped.removeprefix(ALSO)
            line = f"{ALSO}{entry}\n" if entry in live else f"{entry}\n"
            live.add(entry)
        out.append(line)
    return "".join(out)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Beside the file, not the file itself: it is replaced, and a lock on the old inode would not hold.
    # O_NOFOLLOW: root writes here; a planted symlink must not send the open elsewhere.
    fd = os.open(path.parent / f".{path.name}.garrison.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def update_hosts(state_dir: Path, entries: Sequence[tuple[str, str]], path: Path = HOSTS_FILE) -> bool:
    """Write (or with no ``entries`` remove) the cluster's block in ``path``. False when nothing changed."""
    with _locked(path):
        try:
            old = path.read_text()
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            old, mode = "", 0o644
        new = edit_block(old, state_dir, entries)
        if new == old:
            return False
        temporary = path.parent / f".{path.name}.garrison.{os.getpid()}.tmp"
        temporary.unlink(missing_ok=True)  # a leftover of a killed run; O_EXCL then refuses anything planted
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            os.write(fd, new.encode())
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
        return True
