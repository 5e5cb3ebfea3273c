"""``ovspec cache``: output and exit codes through click's CliRunner."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import ovspec.cli.commands  # noqa: F401 - registers the command modules
from ovspec.cli import cli
from ovspec.cli.units import parse_size
from ovspec.store.keys import COMPONENT_NAMES, BlobKey
from ovspec.store.local import ProducedBlob, Store

SUBCOMMANDS = ["ls", "stats", "check", "gc", "clear", "explain"]


def make_key(capacity: int, device: str = "CPU") -> BlobKey:
    values = {name: f"fake-{name}" for name in COMPONENT_NAMES}
    values["specialization"] = f"decode capacity={capacity}"
    values["device"] = device
    return BlobKey.from_values(values)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """A store with two entries that differ in specialization and device."""
    path = tmp_path / "store"
    with Store(path, strict=True) as store:
        for capacity, device in ((1024, "CPU"), (2048, "NPU")):
            store.get_or_create(
                make_key(capacity, device),
                lambda p: (p.write_bytes(os.urandom(3000)), ProducedBlob(compile_s=0.75))[1],
            )
    yield path
    with Store(path, strict=True) as store:
        assert store.check() == []


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def run(
    runner: CliRunner, *args: str, root: Path | None = None, stdin: str | None = None
) -> Result:
    argv = ["cache", *args]
    if root is not None:
        argv += ["--cache-dir", str(root)]
    return runner.invoke(cli, argv, input=stdin)


def hexes() -> list[str]:
    return [make_key(1024).hex, make_key(2048, "NPU").hex]


def test_group_help_lists_every_subcommand(runner: CliRunner) -> None:
    result = run(runner, "--help")
    assert result.exit_code == 0
    for name in SUBCOMMANDS:
        assert name in result.output


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_subcommand_help(runner: CliRunner, name: str) -> None:
    result = run(runner, name, "--help")
    assert result.exit_code == 0, result.output
    assert "--cache-dir" in result.output


def test_ls_table_and_json(runner: CliRunner, root: Path) -> None:
    result = run(runner, "ls", root=root)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:4] == ["KEY", "SPECIALIZATION", "MODEL", "DEVICE"]
    assert len(lines) == 3
    assert any(h[:12] in result.output for h in hexes())
    assert "decode capacity=2048" in result.output and "NPU" in result.output
    assert "2.9 KiB" in result.output and "0.75" in result.output

    listed = json.loads(run(runner, "ls", "--json", root=root).output)
    assert sorted(e["hex"] for e in listed) == sorted(hexes())
    assert listed[0]["components"]["device"] in {"CPU", "NPU"}


def test_ls_empty_store(runner: CliRunner, tmp_path: Path) -> None:
    Store(tmp_path / "empty").close()
    result = run(runner, "ls", root=tmp_path / "empty")
    assert result.exit_code == 0 and "no entries" in result.output


@pytest.mark.parametrize("command", [["ls"], ["stats"], ["check"], ["explain", "a", "b"]])
def test_read_only_commands_never_create_a_store(
    runner: CliRunner, tmp_path: Path, command: list[str]
) -> None:
    mistyped = tmp_path / "typo"
    result = run(runner, *command, root=mistyped)
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"ovspec: error: no ovspec store at {mistyped}; check --cache-dir, or build one "
        "with `ovspec build`"
    )
    assert not mistyped.exists()


def test_cache_dir_from_the_environment(runner: CliRunner, root: Path) -> None:
    result = runner.invoke(cli, ["cache", "ls", "--json"], env={"OVSPEC_CACHE_DIR": str(root)})
    assert result.exit_code == 0 and len(json.loads(result.output)) == 2


def test_stats_text_and_json(runner: CliRunner, root: Path) -> None:
    with Store(root) as store:
        assert store.lookup(make_key(1024)) is not None
    result = run(runner, "stats", root=root)
    assert result.exit_code == 0
    assert "hits         1" in result.output and "saved        0.75 s" in result.output
    data = json.loads(run(runner, "stats", "--json", root=root).output)
    assert (data["entries"], data["hits"], data["misses"], data["stored_bytes"]) == (2, 1, 2, 6000)


def test_check_healthy_corrupt_and_fixed(runner: CliRunner, root: Path) -> None:
    result = run(runner, "check", root=root)
    assert result.exit_code == 0 and "store OK: 2 entries" in result.output

    blob = next(root.glob("blobs/*/*.blob"))
    blob.write_bytes(b"garbage")
    result = run(runner, "check", root=root)
    assert result.exit_code == 1
    assert "problem: entry" in result.output and "payload corrupt" in result.output
    data = json.loads(run(runner, "check", "--json", root=root).output)
    assert len(data["found"]) == 1 and data["remaining"] == data["found"]

    result = run(runner, "check", "--fix", root=root)
    assert result.exit_code == 0, result.output
    assert "fixed: entry" in result.output and "store OK after 1 repair\n" in result.output
    assert run(runner, "check", root=root).exit_code == 0


def test_gc_evicts_to_a_new_limit(runner: CliRunner, root: Path) -> None:
    result = run(runner, "gc", "--size-limit", "4000B", root=root)
    assert result.exit_code == 0, result.output
    assert "evicted 1 entry (2.9 KiB)" in result.output
    with Store(root) as store:
        assert store.size_limit_bytes == 4000 and len(store.entries()) == 1
    assert run(runner, "gc", "--size-limit", "0", root=root).exit_code == 2
    data = json.loads(run(runner, "gc", "--size-limit", "10G", "--json", root=root).output)
    assert data["size_limit_bytes"] == 10 * 2**30 and data["evicted_entries"] == 0


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("10G", 10 * 2**30),
        ("512M", 512 * 2**20),
        ("1.5GiB", 3 * 2**29),
        ("4000B", 4000),
        ("2k", 2048),
    ],
)
def test_size_options_take_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "10X", "-5", "0", "1.5 ZB", "4000", "1.5", "0.5B"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_clear_asks_unless_yes(runner: CliRunner, root: Path) -> None:
    result = run(runner, "clear", root=root, stdin="n\n")
    assert result.exit_code == 0 and f"left {root} as it was" in result.stdout  # a no is no error
    assert len(json.loads(run(runner, "ls", "--json", root=root).output)) == 2
    (root / "models" / "tiny-0123").mkdir(parents=True)
    (root / "models" / "tiny-0123" / "openvino_model.bin").write_bytes(b"w" * 5000)
    result = run(runner, "clear", "--yes", root=root)
    assert result.exit_code == 0 and "removed 2 entries" in result.output
    assert json.loads(run(runner, "ls", "--json", root=root).output) == []
    assert not (root / "models").exists()  # written models are the store's to clear
    again = json.loads(run(runner, "clear", "--yes", "--json", root=root).output)
    assert again["cleared"] and again["removed_entries"] == 0


def test_stats_count_everything_the_store_holds(runner: CliRunner, root: Path) -> None:
    (root / "models").mkdir(0o700)  # a store folder: owner-only, as ovspec makes it
    (root / "models" / "tiny-0123").mkdir()
    (root / "models" / "tiny-0123" / "openvino_model.bin").write_bytes(b"w" * 5000)
    data = json.loads(run(runner, "stats", "--json", root=root).output)
    disk = data["disk"]
    blob_files = sum(p.stat().st_size for p in (root / "blobs").rglob("*") if p.is_file())
    assert (disk["models_bytes"], disk["blobs_bytes"]) == (5000, blob_files)
    assert disk["index_bytes"] > 0  # the index database (its size depends on SQLite's WAL)
    parts = ("blobs_bytes", "models_bytes", "index_bytes", "other_bytes")
    assert disk["total_bytes"] == sum(disk[k] for k in parts)
    text = run(runner, "stats", root=root).output
    assert "models       4.9 KiB" in text and "on disk" in text


def test_explain_names_the_differing_components(runner: CliRunner, root: Path) -> None:
    a, b = hexes()
    result = run(runner, "explain", a[:10], b[:10], root=root)
    assert result.exit_code == 0, result.output
    assert f"2 of {len(COMPONENT_NAMES)} components differ" in result.output
    assert "specialization\n  a: decode capacity=1024\n  b: decode capacity=2048" in result.output
    assert "device\n  a: CPU\n  b: NPU" in result.output
    data = json.loads(run(runner, "explain", a[:10], b[:10], "--json", root=root).output)
    assert [d["name"] for d in data["differences"]] == ["specialization", "device"]
    same = run(runner, "explain", a[:10], a, root=root)
    assert same.exit_code == 0 and "identical keys" in same.output


def test_unknown_and_ambiguous_prefixes_are_one_line_errors(runner: CliRunner, root: Path) -> None:
    a, b = hexes()
    result = run(runner, "explain", "zzz", b[:8], root=root)
    assert result.exit_code == 2
    assert result.stderr.strip() == "ovspec: error: no entry matches 'zzz'; see `ovspec cache ls`"
    # Add entries until one shares a's first digit, so that digit alone is ambiguous.
    with Store(root, strict=True) as store:
        capacity = 4096
        while not make_key(capacity).hex.startswith(a[0]):
            capacity += 1
        store.get_or_create(
            make_key(capacity), lambda p: (p.write_bytes(b"x"), ProducedBlob(compile_s=0.1))[1]
        )
    result = run(runner, "explain", a[0], b[:8], root=root)
    assert result.exit_code == 2
    assert f"prefix '{a[0]}' is ambiguous: it matches 2 entries" in result.stderr


def test_unusable_cache_dir_is_exit_2(runner: CliRunner, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run(runner, "gc", root=blocker / "sub")
    assert result.exit_code == 2
    assert "no ovspec store at" in result.stderr and "--cache-dir" in result.stderr
    assert "Traceback" not in result.output
