"""garrison/trusted_paths.py and the key owner check: what a daemon refuses to trust (issue 20).

As root, the foreign owner is a real other uid (files chowned to it); without root those cases skip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from garrison.signing import AuthError, load_or_create_key
from garrison.trusted_paths import UntrustedPath, check_trusted_dir, check_trusted_file, ensure_trusted_dir

OTHER_UID = 4242  # nobody's uid here; as root we can give files to it

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")


def test_a_missing_directory_is_created_private_and_an_own_one_is_accepted(tmp_path: Path) -> None:
    target = tmp_path / "a" / "state"
    ensure_trusted_dir(target)
    assert target.is_dir() and (target.stat().st_mode & 0o777) == 0o700
    ensure_trusted_dir(target)  # again: exists, ours
    ensure_trusted_dir(tmp_path / "shared", mode=0o755)
    assert (tmp_path / "shared").stat().st_mode & 0o777 == 0o755


@needs_root
def test_a_directory_someone_else_made_first_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "state"
    planted.mkdir()
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(UntrustedPath, match=r"state belongs to uid 4242, not to this daemon's user"):
        ensure_trusted_dir(planted, "--state-dir")
    # Inside a directory of theirs, even one we made ourselves could be swapped away.
    os.chown(planted, 0, 0)
    inner = planted / "inner"
    inner.mkdir()
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(UntrustedPath, match="which belongs to uid 4242"):
        check_trusted_dir(inner)


def test_writable_by_others_symlinks_and_non_directories_are_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(UntrustedPath, match=r"writable by others \(mode 0777\).*chmod go-w"):
        check_trusted_dir(open_dir)
    (tmp_path / "link").symlink_to(tmp_path)
    with pytest.raises(UntrustedPath, match="symbolic link"):
        check_trusted_dir(tmp_path / "link")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UntrustedPath, match="not a directory"):
        check_trusted_dir(tmp_path / "file")
    # In a world-writable directory without the sticky bit anyone could rename it away.
    inside = open_dir / "state"
    inside.mkdir(mode=0o700)
    with pytest.raises(UntrustedPath, match="not sticky"):
        check_trusted_dir(inside)
    os.chmod(open_dir, 0o1777)  # like /tmp: fine
    check_trusted_dir(inside)


@needs_root
def test_a_key_file_of_another_user_is_refused_even_when_private(tmp_path: Path) -> None:
    key_file = tmp_path / "credential.key"
    key_file.write_bytes(b"k" * 32)
    os.chmod(key_file, 0o600)
    os.chown(key_file, OTHER_UID, OTHER_UID)
    with pytest.raises(AuthError, match=r"belongs to uid 4242, not to this daemon's user \(uid 0\)"):
        load_or_create_key(key_file)
    with pytest.raises(UntrustedPath, match="belongs to uid 4242"):
        check_trusted_file(key_file, "controller.key_file")
    os.chown(key_file, 0, 0)
    assert load_or_create_key(key_file) == b"k" * 32
    check_trusted_file(tmp_path / "missing")  # the daemon will create it
