"""The remote tier's manifest without a server: canonical JSON, parsing that trusts
nothing, HMAC signing with key rotation, and the key file."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ovspec.errors import RemoteIntegrityError, RemoteSignatureError, StoreError
from ovspec.store.keys import COMPONENT_NAMES, BlobKey
from ovspec.store.manifest import (
    Manifest,
    SigningKeys,
    canonical_json,
    describe_payload,
    new_manifest,
)


def make_key(tag: str) -> BlobKey:
    return BlobKey.from_values({name: f"{name}-{tag}" for name in COMPONENT_NAMES})


def manifest_of(data: bytes, tag: str = "m", compile_s: float = 1.5) -> Manifest:
    ref = describe_payload(io.BytesIO(data))
    return new_manifest(make_key(tag), ref, compile_s, {"device": "CPU", "specialization": "x"})


KEYS = SigningKeys({"team": b"0123456789abcdef0123456789abcdef"})

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(st.text(), json_values, max_size=6))
def test_canonical_json_is_one_string_per_value(obj: dict[str, object]) -> None:
    reordered = dict(reversed(list(obj.items())))
    assert canonical_json(obj) == canonical_json(reordered)
    assert json.loads(canonical_json(obj)) == obj
    assert b" " not in canonical_json({"a": [1, 2], "b": {"c": 3}})


def test_canonical_json_is_utf8_and_refuses_nan() -> None:
    assert canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()
    with pytest.raises(ValueError):
        canonical_json({"a": float("nan")})


def test_describe_payload_hashes_from_the_start() -> None:
    data = os.urandom(10_000)
    f = io.BytesIO(data)
    f.seek(5000)  # wherever the file was left
    ref = describe_payload(f)
    assert ref.size_bytes == 10_000
    import hashlib

    assert ref.sha256 == hashlib.sha256(data).hexdigest()


def test_round_trip_through_bytes() -> None:
    m = KEYS.sign(manifest_of(b"payload"))
    again = Manifest.from_bytes(m.to_bytes())
    assert again == m
    assert again.compile_us == 1_500_000 and again.compile_s == 1.5
    KEYS.verify(again)


@pytest.mark.parametrize(
    "data",
    [
        b"{not json",
        b"[]",
        b'{"format": "ovspec-remote 0"}',
        b"\xff\xfe",
    ],
)
def test_malformed_manifests_are_integrity_errors(data: bytes) -> None:
    with pytest.raises(RemoteIntegrityError, match="malformed manifest"):
        Manifest.from_bytes(data)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("compile_us",), 1.5),  # a float would make canonical JSON language-dependent
        (("compile_us",), True),
        (("payload", "size_bytes"), -1),
        (("payload", "sha256"), "not hex"),
        (("hex",), 7),
        (("metadata",), {"a": 1}),
        (("components",), [["a"]]),
        (("signature",), {"alg": "hmac-sha256"}),
    ],
    ids=lambda v: str(v),
)
def test_every_field_is_checked(path: tuple[str, ...], value: object) -> None:
    obj = json.loads(manifest_of(b"x").to_bytes())
    target = obj
    for name in path[:-1]:
        target = target[name]
    target[path[-1]] = value
    with pytest.raises(RemoteIntegrityError):
        Manifest.from_bytes(json.dumps(obj).encode())


@pytest.mark.parametrize(
    "change",
    ["hex", "sha256", "size", "metadata", "compile", "components", "created"],
)
def test_any_change_to_a_signed_manifest_breaks_its_signature(change: str) -> None:
    signed = KEYS.sign(manifest_of(b"some payload bytes"))
    obj = signed.to_json()
    if change == "hex":
        obj["hex"] = make_key("other").hex
    elif change == "sha256":
        obj["payload"]["sha256"] = "0" * 64
    elif change == "size":
        obj["payload"]["size_bytes"] += 1
    elif change == "metadata":
        obj["metadata"]["device"] = "NPU"
    elif change == "compile":
        obj["compile_us"] += 1
    elif change == "components":
        obj["components"] = obj["components"][::-1]
    else:
        obj["created_unix_s"] += 1
    with pytest.raises(RemoteSignatureError, match="does not match"):
        KEYS.verify(Manifest.from_json(obj))
    KEYS.verify(signed)  # the untouched one still verifies


def test_unsigned_unknown_key_and_wrong_secret_are_refused() -> None:
    m = manifest_of(b"abc")
    with pytest.raises(RemoteSignatureError, match="unsigned"):
        KEYS.verify(m)
    with pytest.raises(RemoteSignatureError, match="unknown key 'other'"):
        KEYS.verify(SigningKeys({"other": b"x" * 32}).sign(m))
    with pytest.raises(RemoteSignatureError, match="does not match"):
        KEYS.verify(SigningKeys({"team": b"y" * 32}).sign(m))
    alien = Manifest.from_json(
        {**KEYS.sign(m).to_json(), "signature": {"alg": "ed25519", "key_id": "team", "mac": "00"}}
    )
    with pytest.raises(RemoteSignatureError, match="not hmac"):
        KEYS.verify(alien)


def test_key_rotation_verifies_old_and_new() -> None:
    old = SigningKeys({"2026a": b"a" * 32})
    both = SigningKeys({"2026b": b"b" * 32, "2026a": b"a" * 32})
    m = manifest_of(b"rot")
    both.verify(old.sign(m))
    signed_new = both.sign(m)
    assert signed_new.signature is not None and signed_new.signature.key_id == "2026b"
    with pytest.raises(RemoteSignatureError):
        old.verify(signed_new)


def test_a_manifest_must_name_the_key_asked_for() -> None:
    m = manifest_of(b"abc", tag="a")
    m.check_names(make_key("a"))
    with pytest.raises(RemoteIntegrityError, match="describes another key"):
        m.check_names(make_key("b"))


def test_weak_or_malformed_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 16"):
        SigningKeys({"k": b"short"})
    with pytest.raises(ValueError, match="key id"):
        SigningKeys({"bad id": b"x" * 32})
    with pytest.raises(ValueError, match="at least one"):
        SigningKeys({})


def test_key_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# team keys\nnew:{'ab' * 32}\nold:{'cd' * 32}  # retiring\n")
    path.chmod(0o600)
    keys = SigningKeys.load(path)
    assert keys.key_ids == ("new", "old") and keys.signing_key_id == "new"
    path.chmod(0o644)
    with pytest.raises(StoreError, match="chmod 600"):
        SigningKeys.load(path)
    path.chmod(0o600)
    path.write_text("new:zz\n")
    with pytest.raises(StoreError, match="line 1"):
        SigningKeys.load(path)
    with pytest.raises(StoreError, match="cannot read the signing key file"):
        SigningKeys.load(tmp_path / "absent")
