"""The remote tier from the command line, against a real S3 server: two cache folders
("two machines") sharing a remote through `build`, `generate`, `cache push|pull`,
`cache stats` and `plan`; bad remote settings are one line and exit 2."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from s3server import BUCKET, closed_port, new_prefix

import ovspec.cli.commands  # noqa: F401  (registers the commands)
from ovspec.cli import cli
from ovspec.store.tier import RemoteWarning
from ovspec.testing.seaweed import ADMIN, SeaweedServer

LADDER = ["--ladder", "32,64", "--chunk", "16"]


def aws_env(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ADMIN.access_key,
        "AWS_SECRET_ACCESS_KEY": ADMIN.secret_key,
    }


@pytest.fixture
def env(seaweed: SeaweedServer) -> dict[str, str]:
    return {**aws_env(seaweed.endpoint), "OVSPEC_REMOTE": f"s3://{BUCKET}/{new_prefix()}"}


def run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env=env)


def doc(result: Result) -> dict[str, object]:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_build_on_two_machines(env: dict[str, str], tiny_dir: Path, tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    first = doc(run(env, "build", str(tiny_dir), *LADDER, "--cache-dir", a, "--json"))
    assert first["totals"]["misses"] == 4 and first["totals"]["uploaded"] == 4  # type: ignore[index]
    assert first["remote"] == env["OVSPEC_REMOTE"]
    second = doc(run(env, "build", str(tiny_dir), *LADDER, "--cache-dir", b, "--json"))
    totals = second["totals"]
    assert (totals["fetched"], totals["misses"], totals["uploaded"]) == (4, 0, 0)  # type: ignore[index]
    assert all(e["fetched"] for e in second["entries"])  # type: ignore[union-attr]
    text = run(env, "build", str(tiny_dir), *LADDER, "--cache-dir", b)
    assert text.exit_code == 0 and "4 hits, 0 misses" in text.output
    stats = doc(run(env, "cache", "stats", "--cache-dir", b, "--json"))
    remote = stats["remote"]
    assert remote["hits"] == 4 and remote["fetched_bytes"] == totals["fetched_bytes"]  # type: ignore[index]
    assert remote["saved_compile_s"] > 0  # type: ignore[index,operator]
    shown = run(env, "cache", "stats", "--cache-dir", b)
    assert "remote hits  4" in shown.output and "remote saved" in shown.output


def test_generate_fetches_on_a_fresh_machine(
    env: dict[str, str], tiny_dir: Path, tmp_path: Path
) -> None:
    assert (
        run(env, "build", str(tiny_dir), *LADDER, "--cache-dir", str(tmp_path / "a")).exit_code == 0
    )
    out = doc(
        run(
            env,
            "generate",
            str(tiny_dir),
            "--ids",
            "1,2,3",
            *LADDER,
            "--max-new-tokens",
            "40",
            "--load-mode",
            "import",
            "--cache-dir",
            str(tmp_path / "b"),
            "--json",
        )
    )
    kinds = {e["kind"] for e in out["events"]}  # type: ignore[union-attr]
    assert "fetched" in kinds and "compiled" not in kinds


def test_push_then_pull_a_ladder(env: dict[str, str], tiny_dir: Path, tmp_path: Path) -> None:
    local_only = {k: v for k, v in env.items() if k != "OVSPEC_REMOTE"}
    a = str(tmp_path / "a")
    assert run(local_only, "build", str(tiny_dir), *LADDER, "--cache-dir", a).exit_code == 0
    pushed = doc(run(env, "cache", "push", str(tiny_dir), *LADDER, "--cache-dir", a, "--json"))
    assert pushed["ok"] and pushed["counts"] == {"published": 4}
    again = doc(run(env, "cache", "push", str(tiny_dir), *LADDER, "--cache-dir", a, "--json"))
    assert again["counts"] == {"on_remote": 4} and again["moved_bytes"] == 0
    b = str(tmp_path / "b")
    pulled = doc(run(env, "cache", "pull", str(tiny_dir), *LADDER, "--cache-dir", b, "--json"))
    assert pulled["counts"] == {"pulled": 4} and pulled["moved_bytes"] == pushed["moved_bytes"]
    wider = run(
        env,
        "cache",
        "pull",
        str(tiny_dir),
        "--ladder",
        "32,64,128",
        "--chunk",
        "16",
        "--cache-dir",
        b,
    )
    assert wider.exit_code == 1  # decode@128 and prefill@128 were never built anywhere
    assert "missing" in wider.output and "4 local, 2 missing" in wider.output


def test_plan_models_a_fetch_once_the_store_has_measured_one(
    env: dict[str, str], tiny_dir: Path, tmp_path: Path
) -> None:
    assert (
        run(env, "build", str(tiny_dir), *LADDER, "--cache-dir", str(tmp_path / "a")).exit_code == 0
    )
    b = str(tmp_path / "b")
    plan = [
        "plan",
        str(tiny_dir),
        *LADDER,
        "--prompt-tokens",
        "8",
        "--decode-ms",
        "1",
        "--cache-dir",
        b,
        "--json",
    ]
    before = doc(run(env, *plan))  # history from the remote's manifests; no bandwidth yet
    assert all(r["fetch_s"] is None for r in before["rungs"])  # type: ignore[union-attr]
    assert "no fetch measured" in before["sources"]["fetch"]  # type: ignore[index]
    pulled = run(
        env, "cache", "pull", str(tiny_dir), "--ladder", "32", "--chunk", "16", "--cache-dir", b
    )
    assert pulled.exit_code == 0, pulled.output
    after = doc(run(env, *plan))
    assert all(r["fetch_s"] is not None for r in after["rungs"])  # type: ignore[union-attr]
    assert [x["source"] for x in after["plan"]["boundaries"]] == ["fetch"]  # type: ignore[index]
    # --measure on a fresh machine fetches each rung, and times the fetch it made.
    measured = doc(
        run(
            env,
            "plan",
            str(tiny_dir),
            *LADDER,
            "--prompt-tokens",
            "8",
            "--measure",
            "--measure-steps",
            "2",
            "--load-mode",
            "import",
            "--cache-dir",
            str(tmp_path / "c"),
            "--json",
        )
    )
    for rung in measured["rungs"]:  # type: ignore[union-attr]
        assert rung["measured"]["fetched"] and rung["fetch_s"] is not None
        assert rung["compile_s"] > rung["measured"]["import_s"]  # the compile it replaced


def test_bad_remote_settings_are_one_line(tiny_dir: Path, tmp_path: Path) -> None:
    bad_url = run(
        {},
        "build",
        str(tiny_dir),
        *LADDER,
        "--cache-dir",
        str(tmp_path / "x"),
        "--remote",
        "http://bucket",
    )
    assert bad_url.exit_code == 2
    assert "is not s3://BUCKET[/PREFIX]; check --remote s3://" in bad_url.output
    assert not (tmp_path / "x").exists()  # refused before the store was opened
    no_remote = run({}, "cache", "pull", str(tiny_dir), *LADDER, "--cache-dir", str(tmp_path))
    assert no_remote.exit_code == 2 and "needs a remote: give --remote" in no_remote.output
    key_file = tmp_path / "keys"
    key_file.write_text(f"team:{'ab' * 32}\n")
    key_file.chmod(0o644)
    loose = run(
        {},
        "build",
        str(tiny_dir),
        *LADDER,
        "--cache-dir",
        str(tmp_path / "y"),
        "--remote",
        "s3://bucket/p",
        "--remote-key-file",
        str(key_file),
    )
    assert loose.exit_code == 2 and "chmod 600" in loose.output


def test_a_remote_that_is_down_is_one_warning(tiny_dir: Path, tmp_path: Path) -> None:
    env = {**aws_env(f"http://127.0.0.1:{closed_port()}"), "OVSPEC_REMOTE": "s3://bucket/p"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = doc(
            run(env, "build", str(tiny_dir), *LADDER, "--cache-dir", str(tmp_path), "--json")
        )
    assert result["totals"]["misses"] == 4  # type: ignore[index]
    assert len([w for w in caught if issubclass(w.category, RemoteWarning)]) == 1
