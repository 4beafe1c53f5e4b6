"""Local identity: signed credentials, the key file, the SO_PEERCRED service and the client's cache."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import garrison.auth
from garrison.auth import (
    AuthError,
    CredentialService,
    Principal,
    cached_credential,
    default_cache_dir,
    fetch_credential,
    issue_credential,
    load_or_create_key,
    peek_credential,
    principal_for,
    verify_credential,
)

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
ADA = Principal(user="ada", uid=1234, gid=100, groups=(100, 27, 999))
NOBODY_UID = 65534


# ------------------------------------------------------------------------------------------ tokens


def test_credential_round_trip() -> None:
    token = issue_credential(KEY, ADA, now=1000.0, lifetime_s=300.0)
    assert verify_credential(KEY, token, now=1299.0) == ADA


def test_credential_is_url_safe_text_with_a_version_tag() -> None:
    token = issue_credential(KEY, ADA, now=1000.0, lifetime_s=300.0)
    assert token.startswith("v1.")
    assert all(char.isalnum() or char in "-_." for char in token)


def test_claims_are_readable_without_the_key() -> None:
    claims = peek_credential(issue_credential(KEY, ADA, now=1000.0, lifetime_s=300.0))
    assert claims.principal == ADA
    assert claims.expires_at == 1300.0


def test_expired_credential_is_refused() -> None:
    token = issue_credential(KEY, ADA, now=1000.0, lifetime_s=300.0)
    with pytest.raises(AuthError, match="expired"):
        verify_credential(KEY, token, now=1300.0)
    with pytest.raises(AuthError, match="expired"):
        verify_credential(KEY, token, now=5000.0)


def test_credential_signed_with_another_key_is_refused() -> None:
    token = issue_credential(OTHER_KEY, ADA, now=1000.0, lifetime_s=300.0)
    with pytest.raises(AuthError, match="signature"):
        verify_credential(KEY, token, now=1001.0)


def _flip(text: str, position: int) -> str:
    replacement = "B" if text[position] != "B" else "C"
    return text[:position] + replacement + text[position + 1 :]


@pytest.mark.parametrize("part", [1, 2])
def test_flipping_any_character_of_claims_or_signature_is_detected(part: int) -> None:
    token = issue_credential(KEY, ADA, now=1000.0, lifetime_s=300.0)
    pieces = token.split(".")
    for position in range(len(pieces[part])):
        tampered_pieces = list(pieces)
        tampered_pieces[part] = _flip(pieces[part], position)
        with pytest.raises(AuthError):
            verify_credential(KEY, ".".join(tampered_pieces), now=1001.0)


def test_rewritten_claims_with_the_old_signature_are_refused() -> None:
    token = issue_credential(KEY, ADA, now=1000.0, lifetime_s=300.0)
    version, _, signature = token.split(".")
    forged = {"user": "root", "uid": 0, "gid": 0, "groups": [0], "exp": 10.0**12}
    forged_claims = base64.urlsafe_b64encode(json.dumps(forged).encode()).rstrip(b"=").decode()
    with pytest.raises(AuthError, match="signature"):
        verify_credential(KEY, f"{version}.{forged_claims}.{signature}", now=1001.0)


def test_other_version_tag_is_refused() -> None:
    token = issue_credential(KEY, ADA, now=1000.0, lifetime_s=300.0)
    with pytest.raises(AuthError, match="version"):
        verify_credential(KEY, "v2" + token[2:], now=1001.0)


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "garbage",
        "v1.",
        "v1..",
        "v1.a.b",
        "v1.a.b.c",
        "v1.!!!.???",
        "v1." + "A" * 20000,
        "\u00e9.\u00e9.\u00e9",
        "v1.\u00e9.abc",
        "v1.abc.\u00e9",
    ],
)
def test_garbage_is_refused(garbage: str) -> None:
    with pytest.raises(AuthError):
        verify_credential(KEY, garbage, now=1001.0)
    with pytest.raises(AuthError):
        peek_credential(garbage)


@pytest.mark.parametrize(
    "claims",
    [
        [],
        {"user": "ada", "uid": 1, "gid": 1, "groups": []},  # no expiry
        {"user": "", "uid": 1, "gid": 1, "groups": [], "exp": 2000.0},
        {"user": "ada", "uid": -1, "gid": 1, "groups": [], "exp": 2000.0},
        {"user": "ada", "uid": True, "gid": 1, "groups": [], "exp": 2000.0},
        {"user": "ada", "uid": "1", "gid": 1, "groups": [], "exp": 2000.0},
        {"user": "ada", "uid": 1, "gid": 1, "groups": ["wheel"], "exp": 2000.0},
        {"user": "ada", "uid": 1, "gid": 1, "groups": [], "exp": "tomorrow"},
    ],
)
def test_correctly_signed_but_malformed_claims_are_refused(claims: object) -> None:
    # Only a holder of the key could produce these, but the verifier must still not trust their shape.
    encoded = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    signature = hmac.new(KEY, f"v1.{encoded}".encode(), hashlib.sha256).digest()
    token = f"v1.{encoded}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"
    with pytest.raises(AuthError, match="malformed"):
        verify_credential(KEY, token, now=1000.0)


def test_short_keys_and_non_positive_lifetimes_are_programming_errors() -> None:
    with pytest.raises(ValueError):
        issue_credential(b"short", ADA, now=0.0, lifetime_s=10.0)
    with pytest.raises(ValueError):
        issue_credential(KEY, ADA, now=0.0, lifetime_s=0.0)


# --------------------------------------------------------------------------------------------- key


def test_key_is_created_private_and_then_reused(tmp_path: Path) -> None:
    key_path = tmp_path / "credential.key"
    old_umask = os.umask(0)  # even a permissive umask must not widen the mode
    try:
        key = load_or_create_key(key_path)
    finally:
        os.umask(old_umask)
    assert len(key) == 32
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert key_path.read_bytes() == key
    assert load_or_create_key(key_path) == key
    assert [path.name for path in tmp_path.iterdir()] == ["credential.key"]  # no temporary left behind


def test_concurrent_key_creation_agrees_on_one_key(tmp_path: Path) -> None:
    key_path = tmp_path / "credential.key"
    keys: list[bytes] = []
    start = threading.Barrier(8)

    def create() -> None:
        start.wait()
        keys.append(load_or_create_key(key_path))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(keys)) == 1
    assert key_path.read_bytes() == keys[0]


def test_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    key_path = tmp_path / "credential.key"
    key_path.write_bytes(KEY)
    key_path.chmod(0o644)
    with pytest.raises(AuthError, match="readable by others"):
        load_or_create_key(key_path)


def test_key_file_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    key_path = tmp_path / "credential.key"
    key_path.write_bytes(b"too short")
    key_path.chmod(0o600)
    with pytest.raises(AuthError, match="bytes"):
        load_or_create_key(key_path)


def test_key_in_a_missing_directory_is_an_auth_error(tmp_path: Path) -> None:
    with pytest.raises(AuthError, match="cannot create key file"):
        load_or_create_key(tmp_path / "missing" / "credential.key")


# ------------------------------------------------------------------------------------------ service


class FakeClock:
    """A clock the test moves by hand, so expiry is tested without sleeping."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    # pytest's tmp_path lives under a 0700 directory; the unprivileged subprocess needs to reach the socket.
    directory = Path(tempfile.mkdtemp(prefix="garrison-auth-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000.0)


@pytest.fixture
def service(shared_dir: Path, clock: FakeClock) -> Iterator[CredentialService]:
    with CredentialService(shared_dir / "cred.sock", KEY, lifetime_s=300.0, clock=clock) as running:
        yield running


def test_socket_is_open_to_every_local_user(service: CredentialService) -> None:
    info = os.stat(service.socket_path)
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o666


def test_credential_names_the_calling_process(service: CredentialService, clock: FakeClock) -> None:
    principal = verify_credential(KEY, fetch_credential(service.socket_path), now=clock.now)
    assert principal.uid == os.geteuid()
    assert principal.gid == os.getegid()
    assert principal == principal_for(os.geteuid(), os.getegid())
    assert peek_credential(fetch_credential(service.socket_path)).expires_at == clock.now + 300.0


def _interpreter_for_nobody() -> str | None:
    """A Python that uid 65534 can execute: the test's own may sit under a 0700 home (pyenv in /root)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        try:
            probe = subprocess.run(
                [candidate, "-c", "pass"], user=NOBODY_UID, group=NOBODY_UID, extra_groups=[], timeout=60
            )
        except OSError:
            continue
        if probe.returncode == 0:
            return candidate
    return None


# Run as nobody, possibly by an interpreter outside our virtualenv: make this checkout's garrison importable
# the way the editable install maps it (garrison/ plus the repository root for garrison.controller).
_FETCH_AS_ANOTHER_USER = """
import sys
root = sys.argv[1]
sys.path.insert(0, root)
import garrison
garrison.__path__.append(root)
from garrison.auth import fetch_credential
sys.stdout.write(fetch_credential(sys.argv[2]))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_credential_for_another_user_comes_from_the_kernel(
    service: CredentialService, clock: FakeClock
) -> None:
    interpreter = _interpreter_for_nobody()
    if interpreter is None:
        pytest.skip("no Python interpreter that uid 65534 may execute")
    repository_root = str(Path(garrison.auth.__file__).resolve().parent.parent)
    result = subprocess.run(
        [interpreter, "-c", _FETCH_AS_ANOTHER_USER, repository_root, service.socket_path],
        user=NOBODY_UID,
        group=NOBODY_UID,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stderr
    principal = verify_credential(KEY, result.stdout, now=clock.now)
    assert principal.uid == NOBODY_UID
    assert principal.gid == NOBODY_UID
    assert principal == principal_for(NOBODY_UID, NOBODY_UID)
    assert principal.uid != os.geteuid()


def test_unknown_uid_is_named_by_number() -> None:
    unknown = 3_999_999_999
    assert principal_for(unknown, 7) == Principal(user=str(unknown), uid=unknown, gid=7, groups=(7,))


def test_service_answers_every_one_of_hundreds_of_concurrent_requests(
    service: CredentialService, clock: FakeClock
) -> None:
    threads_count, per_thread = 16, 50
    tokens: list[str] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def hammer() -> None:
        for _ in range(per_thread):
            try:
                token = fetch_credential(service.socket_path, timeout_s=10.0)
            except AuthError as error:
                with lock:
                    failures.append(error)
            else:
                with lock:
                    tokens.append(token)

    threads = [threading.Thread(target=hammer) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    assert len(tokens) == threads_count * per_thread
    assert all(verify_credential(KEY, token, now=clock.now).uid == os.geteuid() for token in tokens)


def test_stop_removes_the_socket_and_the_client_explains(shared_dir: Path) -> None:
    socket_path = shared_dir / "cred.sock"
    running = CredentialService(socket_path, KEY)
    running.start()
    running.stop()
    assert not socket_path.exists()
    with pytest.raises(AuthError, match="does not exist"):
        fetch_credential(str(socket_path))


def test_stale_socket_is_replaced_but_a_live_one_is_not(shared_dir: Path) -> None:
    socket_path = shared_dir / "cred.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(socket_path))
    stale.close()  # the file stays behind, with nobody listening, as after a crash

    with pytest.raises(AuthError, match="refused"):
        fetch_credential(str(socket_path))

    with CredentialService(socket_path, KEY) as first:
        assert fetch_credential(first.socket_path)
        with pytest.raises(AuthError, match="already listening"):
            CredentialService(socket_path, KEY).start()


def test_service_will_not_replace_a_regular_file(shared_dir: Path) -> None:
    path = shared_dir / "not-a-socket"
    path.write_text("precious")
    with pytest.raises(AuthError, match="not a socket"):
        CredentialService(path, KEY).start()
    assert path.read_text() == "precious"


def test_fetch_from_a_silent_server_times_out(shared_dir: Path) -> None:
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(shared_dir / "silent.sock"))
    silent.listen()
    try:
        with pytest.raises(AuthError, match="timed out"):
            fetch_credential(str(shared_dir / "silent.sock"), timeout_s=0.2)
    finally:
        silent.close()


# -------------------------------------------------------------------------------------------- cache


def _cache_files(cache_dir: Path) -> list[Path]:
    return [path for path in cache_dir.iterdir() if not path.name.startswith(".")]


def test_cached_credential_is_reused_while_valid(
    service: CredentialService, clock: FakeClock, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    first = cached_credential(service.socket_path, cache_dir, now=clock.now)
    assert verify_credential(KEY, first, now=clock.now).uid == os.geteuid()

    (cache_file,) = _cache_files(cache_dir)
    assert stat.S_IMODE(cache_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700

    clock.now += 200.0  # the service would now issue a different token...
    assert cached_credential(service.socket_path, cache_dir, now=clock.now) == first  # ...but 100s remain


def test_cached_credential_is_refreshed_near_expiry(
    service: CredentialService, clock: FakeClock, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    first = cached_credential(service.socket_path, cache_dir, min_validity_s=30.0, now=clock.now)

    clock.now += 280.0  # 20s left: less than min_validity_s
    second = cached_credential(service.socket_path, cache_dir, min_validity_s=30.0, now=clock.now)
    assert second != first
    assert peek_credential(second).expires_at == clock.now + 300.0
    # The fresh token replaced the old one in the cache.
    assert cached_credential(service.socket_path, cache_dir, min_validity_s=30.0, now=clock.now) == second
    assert len(_cache_files(cache_dir)) == 1


def test_cache_is_keyed_by_socket_path(shared_dir: Path, clock: FakeClock, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    with (
        CredentialService(shared_dir / "a.sock", KEY, clock=clock) as service_a,
        CredentialService(shared_dir / "b.sock", OTHER_KEY, clock=clock) as service_b,
    ):
        token_a = cached_credential(service_a.socket_path, cache_dir, now=clock.now)
        token_b = cached_credential(service_b.socket_path, cache_dir, now=clock.now)
    verify_credential(KEY, token_a, now=clock.now)
    verify_credential(OTHER_KEY, token_b, now=clock.now)
    assert len(_cache_files(cache_dir)) == 2


def test_corrupt_or_foreign_cache_is_ignored(
    service: CredentialService, clock: FakeClock, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    cached_credential(service.socket_path, cache_dir, now=clock.now)
    (cache_file,) = _cache_files(cache_dir)

    cache_file.write_text("not a token\n")
    assert verify_credential(
        KEY, cached_credential(service.socket_path, cache_dir, now=clock.now), now=clock.now
    )

    # A still-valid token for someone else (a HOME shared between identities) is not ours to use.
    someone_else = Principal(user="eve", uid=os.geteuid() + 1, gid=1)
    cache_file.write_text(issue_credential(KEY, someone_else, now=clock.now, lifetime_s=300.0))
    token = cached_credential(service.socket_path, cache_dir, now=clock.now)
    assert verify_credential(KEY, token, now=clock.now).uid == os.geteuid()

    # A cache file others could have written is not trusted either.
    cache_file.chmod(0o666)
    planted = issue_credential(
        KEY, principal_for(os.geteuid(), os.getegid()), now=clock.now, lifetime_s=299.0
    )
    cache_file.write_text(planted)
    assert cached_credential(service.socket_path, cache_dir, now=clock.now) != planted


def test_unwritable_cache_still_returns_a_credential(
    service: CredentialService, clock: FakeClock, tmp_path: Path
) -> None:
    blocker = tmp_path / "file-in-the-way"
    blocker.write_text("")
    token = cached_credential(service.socket_path, blocker / "cache", now=clock.now)
    assert verify_credential(KEY, token, now=clock.now).uid == os.geteuid()


def test_cache_miss_without_a_service_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AuthError, match="does not exist"):
        cached_credential(str(tmp_path / "absent.sock"), tmp_path / "cache")


def test_default_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "garrison"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "garrison"
