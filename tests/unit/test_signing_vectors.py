"""Do credentials and user tokens issued by earlier releases still verify, byte for byte?

Every literal below was produced by the code as it stood before the two token codecs (garrison.auth's
local credential and garrison.tokens' user token) were merged into one (garrison.signing), from the fixed
keys, claims and clock values written next to it. The current code must issue exactly the same text from
the same inputs (the format is deterministic: sorted compact JSON, unpadded URL-safe base64, HMAC-SHA256)
and must verify the old text, so no key needs rotating and no issued token stops working.
"""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from garrison.auth import AuthError, issue_credential, peek_credential, verify_credential
from garrison.model.domain import Principal
from garrison.tokens import (
    TokenClaims,
    TokenError,
    TokenRegistry,
    issue_token,
    peek_token,
    verify_token_signature,
)

KEY_COUNTING = bytes(range(32))
KEY_REPEATED = bytes.fromhex("5a" * 32)
KEY_LONG = b"garrison-test-vector-key-0123456789abcdef"  # 41 bytes: longer keys are accepted too


def _another_key(key: bytes) -> bytes:
    """A key of the same length differing from ``key`` in every byte."""
    return bytes(byte ^ 0x01 for byte in key)


# (key, principal, issued at, lifetime in seconds, the credential the old code issued)
CREDENTIAL_VECTORS = [
    (
        KEY_COUNTING,
        Principal(user="alice", uid=1000, gid=1000, groups=(1000, 27)),
        1_700_000_000.0,
        900.0,
        "v1.eyJleHAiOjE3MDAwMDA5MDAuMCwiZ2lkIjoxMDAwLCJncm91cHMiOlsxMDAwLDI3XSwidWlkIjoxMDAwLCJ1c2VyIjoiYWxpY2Ui"
        "fQ.ssmsVCCgw3LjDWZZvjVyJ_DlMis8weUBn6FvKwBWW4c",
    ),
    (
        KEY_REPEATED,
        Principal(user="bob", uid=1001, gid=100, groups=()),
        1_800_000_000.5,
        60.0,
        "v1.eyJleHAiOjE4MDAwMDAwNjAuNSwiZ2lkIjoxMDAsImdyb3VwcyI6W10sInVpZCI6MTAwMSwidXNlciI6ImJvYiJ9"
        ".S8umx3OytKwPikw_nUNO_j--dRg2eVCxrKAVHZhcylk",
    ),
    (
        KEY_LONG,
        Principal(user="root", uid=0, gid=0, groups=(0, 1, 2, 4294967295)),
        0.0,
        1.0,
        "v1.eyJleHAiOjEuMCwiZ2lkIjowLCJncm91cHMiOlswLDEsMiw0Mjk0OTY3Mjk1XSwidWlkIjowLCJ1c2VyIjoicm9vdCJ9"
        ".atXdGnv9ajyAfDv566VBdK5djJu2EPkipi_guaTQfsQ",
    ),
    (
        KEY_COUNTING,
        Principal(user="\u00e9mile", uid=4294967295, gid=4294967295, groups=(5,)),
        1_234_567_890.25,
        3600.0,
        "v1.eyJleHAiOjEyMzQ1NzE0OTAuMjUsImdpZCI6NDI5NDk2NzI5NSwiZ3JvdXBzIjpbNV0sInVpZCI6NDI5NDk2NzI5NSwidXNlciI6"
        "Ilx1MDBlOW1pbGUifQ.p35_i1HPU516RHxODn7uAUuF52BqMX48PMkUDOXY31U",
    ),
]

# (key, claims, the user token the old code issued)
TOKEN_VECTORS = [
    (
        KEY_COUNTING,
        TokenClaims("alice", 1000, "0123456789abcdef", 1_700_000_000.0, 1_700_604_800.0),
        "t1.eyJleHAiOjE3MDA2MDQ4MDAuMCwiaWF0IjoxNzAwMDAwMDAwLjAsImp0aSI6IjAxMjM0NTY3ODlhYmNkZWYiLCJzdWIiOiJhbGlj"
        "ZSIsInVpZCI6MTAwMH0.JW6B21ueZYQ7ECbTZIocP_ZsjB3uADsBbJNURAshIrk",
    ),
    (
        KEY_REPEATED,
        TokenClaims("bob", 0, "ffffffffffffffff", 0.0, 31_536_000.0),
        "t1.eyJleHAiOjMxNTM2MDAwLjAsImlhdCI6MC4wLCJqdGkiOiJmZmZmZmZmZmZmZmZmZmZmIiwic3ViIjoiYm9iIiwidWlkIjowfQ"
        ".gUgSoZ5bBCRMwOXD0dNcf1mLlJhp97xQfBQUsPPvtwE",
    ),
    (
        KEY_LONG,
        TokenClaims("carol", 4294967295, "a1b2c3d4e5f60718", 1_234_567_890.125, 1_234_654_290.125),
        "t1.eyJleHAiOjEyMzQ2NTQyOTAuMTI1LCJpYXQiOjEyMzQ1Njc4OTAuMTI1LCJqdGkiOiJhMWIyYzNkNGU1ZjYwNzE4Iiwic3ViIjoi"
        "Y2Fyb2wiLCJ1aWQiOjQyOTQ5NjcyOTV9.TZ9_ByRSi8tSWaLTbB45AKCMe4Hzzrlt3oOGM3jsU8I",
    ),
]


@pytest.mark.parametrize(
    ("key", "principal", "issued_at", "lifetime_s", "credential"),
    CREDENTIAL_VECTORS,
    ids=range(len(CREDENTIAL_VECTORS)),
)
def test_credentials_are_issued_byte_for_byte_as_before(
    key: bytes, principal: Principal, issued_at: float, lifetime_s: float, credential: str
) -> None:
    assert issue_credential(key, principal, issued_at, lifetime_s) == credential


@pytest.mark.parametrize(
    ("key", "principal", "issued_at", "lifetime_s", "credential"),
    CREDENTIAL_VECTORS,
    ids=range(len(CREDENTIAL_VECTORS)),
)
def test_credentials_issued_before_still_verify_until_they_expire(
    key: bytes, principal: Principal, issued_at: float, lifetime_s: float, credential: str
) -> None:
    assert verify_credential(key, credential, issued_at) == principal
    assert verify_credential(key, credential, issued_at + lifetime_s - 0.001) == principal
    claims = peek_credential(credential)
    assert claims.principal == principal and claims.expires_at == issued_at + lifetime_s
    with pytest.raises(AuthError, match="expired"):
        verify_credential(key, credential, issued_at + lifetime_s)
    with pytest.raises(AuthError, match="signature does not match"):
        verify_credential(_another_key(key), credential, issued_at)


@pytest.mark.parametrize(("key", "claims", "token"), TOKEN_VECTORS, ids=range(len(TOKEN_VECTORS)))
def test_user_tokens_are_issued_byte_for_byte_as_before(key: bytes, claims: TokenClaims, token: str) -> None:
    assert issue_token(key, claims) == token


@pytest.mark.parametrize(("key", "claims", "token"), TOKEN_VECTORS, ids=range(len(TOKEN_VECTORS)))
def test_user_tokens_issued_before_still_verify_until_they_expire(
    key: bytes, claims: TokenClaims, token: str
) -> None:
    assert verify_token_signature(key, token, claims.issued_at) == claims
    assert peek_token(token) == claims
    with pytest.raises(TokenError, match="expired"):
        verify_token_signature(key, token, claims.expires_at)
    with pytest.raises(TokenError, match="signature does not match"):
        verify_token_signature(_another_key(key), token, claims.issued_at)


def test_a_credential_is_never_accepted_as_a_user_token_nor_the_reverse() -> None:
    key, _, issued_at, _, credential = CREDENTIAL_VECTORS[0]
    token_key, claims, token = TOKEN_VECTORS[0]
    with pytest.raises(TokenError, match="unsupported token version 'v1'"):
        verify_token_signature(key, credential, issued_at)
    with pytest.raises(AuthError, match="unsupported credential version 't1'"):
        verify_credential(token_key, token, claims.issued_at)


def test_a_registry_written_before_still_accepts_the_token_it_recorded(tmp_path: Path) -> None:
    """A registry file and a token for uid 0, both as an earlier controller wrote them."""
    root = pwd.getpwuid(0).pw_name
    if root != "root":
        pytest.skip("uid 0 is not named root on this host")
    key = KEY_COUNTING
    token = (
        "t1.eyJleHAiOjIwMDAwMDAwMDAuMCwiaWF0IjoxOTAwMDAwMDAwLjAsImp0aSI6IjAwMTEyMjMzNDQ1NTY2NzciLCJzdWIiOiJyb290"
        "IiwidWlkIjowfQ.Pa3156E5m2SyTrEErWpXZpzE9c0dXX1LMokd2MK-uZc"
    )
    registry_file = tmp_path / "tokens.json"
    registry_file.write_text(
        '{\n "tokens": {\n  "0011223344556677": {\n   "expires_at": 2000000000.0,\n   "issued_at": 1900000000.0,\n'
        '   "issued_by": "root",\n   "revoked_at": null,\n   "token_id": "0011223344556677",\n'
        '   "uid": 0,\n   "user": "root"\n  }\n },\n "version": 1\n}'
    )
    registry_file.chmod(0o600)
    registry = TokenRegistry(registry_file, key, clock=lambda: 1_950_000_000.0)
    assert registry.verify(token).uid == 0
