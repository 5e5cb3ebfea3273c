"""``ovspec.trials.patches`` and ``ovspec patch``: state detection, apply/revert and refusals.

Every test builds its own small git repository that stands in for the compiler
checkout (no network, no upstream tree); one test reads the shipped diff.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import xxhash
from click.testing import CliRunner, Result

import ovspec.cli.patch  # noqa: F401 - registers the `patch` group
from ovspec.cli import cli
from ovspec.errors import PatchError
from ovspec.trials import patches as patching
from ovspec.trials.patches import BaseRelation, Patch, PatchState

HPP = "src/vpux_compiler/include/vpux/compiler/core/async_deps_info.hpp"
CPP = "src/vpux_compiler/src/core/async_deps_info.cpp"
SHIPPED = "npu_compiler-memoize-async-deps"

STOCK_HPP = """#pragma once
namespace vpux {
class AsyncDepsInfo final {
public:
    SmallVector<size_t> getOpDeps(size_t opIdx) const;
private:
    SmallVector<llvm::DenseSet<size_t>> _depsMap;
};
}  // namespace vpux
"""
STOCK_CPP = """#include "vpux/compiler/core/async_deps_info.hpp"

SmallVector<size_t> vpux::AsyncDepsInfo::getOpDeps(size_t opIdx) const {
    SmallVector<size_t> vec(_depsMap[opIdx].begin(), _depsMap[opIdx].end());
    llvm::sort(vec.begin(), vec.end());
    return vec;
}
"""
PATCHED_HPP = STOCK_HPP.replace(
    "    SmallVector<llvm::DenseSet<size_t>> _depsMap;\n",
    "    SmallVector<llvm::DenseSet<size_t>> _depsMap;\n"
    "    mutable SmallVector<SmallVector<size_t>> _sortedCache;\n",
)
PATCHED_CPP = STOCK_CPP.replace(
    "    SmallVector<size_t> vec(",
    "    // memoized in _sortedCache\n    SmallVector<size_t> vec(",
)


def git(repo: Path, *args: str, raw: bool = False) -> str:
    result = subprocess.run(
        [
            "git",
            "-c",
            "user.name=ovspec-test",
            "-c",
            "user.email=test@ovspec.invalid",
            "-c",
            "commit.gpgsign=false",
            *args,
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout if raw else result.stdout.strip()


def write(repo: Path, rel: str, text: str) -> None:
    path = repo / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


HEADER = """# ovspec-patch: {name}
# base-repository: example/fake_compiler
# base-commit: {base}
#
# Commentary git apply skips. It may say things like
#   Order: unchanged.
# without being read as a header key.
"""


@dataclass(frozen=True)
class Checkout:
    repo: Path
    root: str  # a commit before the base (for branches that skip it)
    base: str
    patch: Patch


def make_patch(
    folder: Path, repo: Path, base: str, name: str = "synthetic-memo", header: str = HEADER
) -> Patch:
    """A patch of the two files against ``repo``'s HEAD, with a header naming ``base``."""
    write(repo, HPP, PATCHED_HPP)
    write(repo, CPP, PATCHED_CPP)
    body = git(repo, "diff", "HEAD", raw=True)
    git(repo, "checkout", "--", ".")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.diff"
    path.write_text(header.format(name=name, base=base) + body)
    return Patch.from_file(path)


@pytest.fixture
def checkout(tmp_path: Path) -> Checkout:
    """A repository with the stock files committed at its base commit, and a patch for it."""
    repo = tmp_path / "compiler"
    repo.mkdir()
    git(repo, "init", "-q")
    write(repo, "README.md", "fake compiler\n")
    root = commit_all(repo, "root")
    write(repo, HPP, STOCK_HPP)
    write(repo, CPP, STOCK_CPP)
    base = commit_all(repo, "base")
    patch = make_patch(tmp_path / "patches", repo, base)
    return Checkout(repo, root, base, patch)


def files_of(repo: Path) -> tuple[str, str]:
    return (repo / HPP).read_text(), (repo / CPP).read_text()


# --- the shipped diff ------------------------------------------------------------------


def test_shipped_patch_parses() -> None:
    patches = patching.available_patches()
    assert SHIPPED in [p.name for p in patches]
    patch = next(p for p in patches if p.name == SHIPPED)
    assert patch.base_repository == "openvinotoolkit/npu_compiler"
    assert re.fullmatch(r"[0-9a-f]{40}", patch.base_commit)
    assert set(patch.files) == {HPP, CPP}
    assert patch.body.startswith(b"diff --git ")
    assert patch.id == xxhash.xxh3_128_hexdigest(patch.body)
    # Everything before the body is commentary: no line a diff reader could take as a hunk.
    header = patch.path.read_bytes()[: -len(patch.body)].decode()
    assert header and all(line.startswith("#") for line in header.splitlines())
    # The counters' switch and the invalidation points the header promises are in the code.
    text = patch.body.decode()
    for needle in ("OVSPEC_ASYNC_DEPS_STATS", "invalidateSortedDeps", "getSortedDepsCached"):
        assert needle in text


def test_resolve_patch_by_default_name_and_path(checkout: Checkout) -> None:
    assert patching.resolve_patch(None) == patching.available_patches()[0]
    assert patching.resolve_patch(SHIPPED).name == SHIPPED
    assert patching.resolve_patch(f"{SHIPPED}.diff").name == SHIPPED
    assert patching.resolve_patch(str(checkout.patch.path)) == checkout.patch
    with pytest.raises(PatchError, match=f"no shipped patch named 'nope'; available: {SHIPPED}"):
        patching.resolve_patch("nope")
    with pytest.raises(PatchError, match="does not exist"):
        patching.resolve_patch(str(checkout.repo / "missing.diff"))


def test_without_patch_folder_nothing_is_shipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not a source tree (no pyproject.toml beside patches/) and no packaged copy.
    (tmp_path / "patches").mkdir()
    monkeypatch.setattr(patching, "_SOURCE_ROOT", tmp_path)
    monkeypatch.setattr(patching, "_PACKAGE_PATCH_DIR", "_no_such_folder")
    assert patching.patch_dir() is None
    assert patching.available_patches() == []
    with pytest.raises(PatchError, match="no patches are installed"):
        patching.resolve_patch(None)


# --- reading patch files ------------------------------------------------------------


def test_patch_reads_header_and_files(checkout: Checkout) -> None:
    patch = checkout.patch
    assert patch.name == "synthetic-memo"
    assert patch.base_repository == "example/fake_compiler"
    assert patch.base_commit == checkout.base
    assert patch.files == (HPP, CPP)
    assert patch.to_json()["files"] == [HPP, CPP]


def test_patch_id_covers_the_diff_not_the_commentary(tmp_path: Path, checkout: Checkout) -> None:
    quiet = HEADER.replace("Commentary git apply skips.", "Other words.")
    other = make_patch(tmp_path / "other", checkout.repo, checkout.base, header=quiet)
    assert other.id == checkout.patch.id
    changed = tmp_path / "changed" / "synthetic-memo.diff"
    changed.parent.mkdir()
    changed.write_bytes(checkout.patch.path.read_bytes().replace(b"memoized", b"cached"))
    assert Patch.from_file(changed).id != checkout.patch.id


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("# base-commit:", "# base:"), "no '# base-commit: ...' line"),
        (lambda t: re.sub(r"(base-commit: )(\w{12})\w+", r"\1\2", t), "not a full 40-hex"),
        (lambda t: t.replace("example/fake_compiler", "fake_compiler"), "is not owner/name"),
        (lambda t: t.replace("# ovspec-patch: synthetic-memo", "# ovspec-patch: x"), "rename"),
        (lambda t: t.split("diff --git")[0], "no 'diff --git' line"),
        (lambda t: "# base-commit: " + "0" * 40 + "\n" + t, "repeats the header key"),
    ],
)
def test_bad_patch_files_are_refused(
    tmp_path: Path, checkout: Checkout, edit: Callable[[str], str], message: str
) -> None:
    bad = tmp_path / "bad" / "synthetic-memo.diff"
    bad.parent.mkdir()
    bad.write_text(edit(checkout.patch.path.read_text()))
    with pytest.raises(PatchError, match=re.escape(message)):
        Patch.from_file(bad)


# --- state detection, apply, revert ----------------------------------------------------


def test_check_at_base_is_applicable(checkout: Checkout) -> None:
    report = patching.check(checkout.patch, checkout.repo)
    assert report.state is PatchState.APPLICABLE
    assert report.base is BaseRelation.AT_BASE
    assert report.head == checkout.base
    assert report.to_json()["base_verified"] is True


def test_apply_and_revert_round_trip_and_are_idempotent(checkout: Checkout) -> None:
    stock = files_of(checkout.repo)
    applied = patching.apply(checkout.patch, checkout.repo)
    assert applied.state is PatchState.APPLIED
    assert files_of(checkout.repo) == (PATCHED_HPP, PATCHED_CPP)
    assert git(checkout.repo, "diff", "--cached") == ""  # the index is left alone
    assert patching.apply(checkout.patch, checkout.repo).state is PatchState.APPLIED
    assert files_of(checkout.repo) == (PATCHED_HPP, PATCHED_CPP)

    reverted = patching.revert(checkout.patch, checkout.repo)
    assert reverted.state is PatchState.APPLICABLE
    assert files_of(checkout.repo) == stock
    assert patching.revert(checkout.patch, checkout.repo).state is PatchState.APPLICABLE
    assert git(checkout.repo, "status", "--porcelain") == ""


def test_descendant_of_base_is_accepted(checkout: Checkout) -> None:
    write(checkout.repo, "README.md", "fake compiler, later\n")
    commit_all(checkout.repo, "later")
    assert patching.check(checkout.patch, checkout.repo).base is BaseRelation.DESCENDANT
    assert patching.apply(checkout.patch, checkout.repo).state is PatchState.APPLIED


def test_head_not_descending_from_base_is_refused(checkout: Checkout) -> None:
    git(checkout.repo, "checkout", "-q", "-b", "elsewhere", checkout.root)
    write(checkout.repo, HPP, STOCK_HPP)
    write(checkout.repo, CPP, STOCK_CPP)
    commit_all(checkout.repo, "same files, other history")
    with pytest.raises(PatchError, match="does not descend from patch synthetic-memo's base"):
        patching.check(checkout.patch, checkout.repo)


def test_unknown_base_falls_back_to_apply_check(tmp_path: Path, checkout: Checkout) -> None:
    absent = "0123456789abcdef" * 2 + "01234567"
    patch = make_patch(tmp_path / "unknown", checkout.repo, absent)
    report = patching.check(patch, checkout.repo)
    assert report.base is BaseRelation.BASE_UNKNOWN
    assert report.state is PatchState.APPLICABLE
    assert report.to_json()["base_verified"] is False
    assert "compatibility not verified" in report.describe()


def test_conflicting_upstream_change_is_a_conflict(checkout: Checkout) -> None:
    write(checkout.repo, CPP, STOCK_CPP.replace("SmallVector<size_t> vec(", "auto vec = Vec("))
    commit_all(checkout.repo, "upstream rewrote the function")
    report = patching.check(checkout.patch, checkout.repo)
    assert report.state is PatchState.CONFLICT
    assert "patch failed" in report.detail or "does not apply" in report.detail
    with pytest.raises(PatchError, match="does not apply to"):
        patching.apply(checkout.patch, checkout.repo)
    with pytest.raises(PatchError, match="nothing to revert"):
        patching.revert(checkout.patch, checkout.repo)
    assert files_of(checkout.repo)[0] == STOCK_HPP  # nothing half-applied


def test_committed_patch_is_in_head(checkout: Checkout) -> None:
    patching.apply(checkout.patch, checkout.repo)
    commit_all(checkout.repo, "patched")
    assert patching.check(checkout.patch, checkout.repo).state is PatchState.IN_HEAD
    assert patching.apply(checkout.patch, checkout.repo).state is PatchState.IN_HEAD
    with pytest.raises(PatchError, match="committed in HEAD"):
        patching.revert(checkout.patch, checkout.repo)


# --- refusals -----------------------------------------------------------------------


def test_uncommitted_change_in_a_touched_file_is_refused(checkout: Checkout) -> None:
    write(checkout.repo, CPP, STOCK_CPP + "// local experiment\n")
    for action in (patching.check, patching.apply, patching.revert):
        with pytest.raises(PatchError, match=re.escape(CPP)) as info:
            action(checkout.patch, checkout.repo)
        assert HPP not in str(info.value)
        assert "stash" in str(info.value)
    assert (checkout.repo / CPP).read_text().endswith("// local experiment\n")


def test_edit_on_top_of_the_applied_patch_is_refused(checkout: Checkout) -> None:
    patching.apply(checkout.patch, checkout.repo)
    write(checkout.repo, HPP, PATCHED_HPP + "// more\n")
    with pytest.raises(PatchError, match=re.escape(HPP)):
        patching.revert(checkout.patch, checkout.repo)


def test_uncommitted_changes_elsewhere_are_allowed(checkout: Checkout) -> None:
    write(checkout.repo, "README.md", "local notes\n")
    write(checkout.repo, "untracked.txt", "scratch\n")
    assert patching.apply(checkout.patch, checkout.repo).state is PatchState.APPLIED
    assert patching.revert(checkout.patch, checkout.repo).state is PatchState.APPLICABLE
    assert (checkout.repo / "README.md").read_text() == "local notes\n"


def test_plain_folder_is_refused(tmp_path: Path, checkout: Checkout) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(PatchError, match="is not a git checkout"):
        patching.check(checkout.patch, plain)
    with pytest.raises(PatchError, match="is not a directory"):
        patching.check(checkout.patch, tmp_path / "absent")


def test_subfolder_of_checkout_is_refused(checkout: Checkout) -> None:
    with pytest.raises(PatchError, match="not its top; pass"):
        patching.check(checkout.patch, checkout.repo / "src")


def test_other_repository_is_refused(tmp_path: Path, checkout: Checkout) -> None:
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    write(other, "main.c", "int main(void) { return 0; }\n")
    commit_all(other, "unrelated")
    with pytest.raises(PatchError, match="lacks files patch synthetic-memo changes") as info:
        patching.check(checkout.patch, other)
    assert HPP in str(info.value) and "example/fake_compiler" in str(info.value)


def test_repository_without_commits_is_refused(tmp_path: Path, checkout: Checkout) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    with pytest.raises(PatchError, match="has no commit checked out"):
        patching.check(checkout.patch, empty)


# --- the command line -----------------------------------------------------------------


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, ["patch", *args])


@pytest.mark.parametrize("sub", [[], ["list"], ["check"], ["apply"], ["revert"]])
def test_help_of_every_subcommand(sub: list[str]) -> None:
    result = run(*sub, "--help")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: cli patch {' '.join(sub)}".rstrip())
    if sub and sub != ["list"]:
        assert "--patch NAME|FILE" in result.output


def test_cli_list_text_and_json() -> None:
    text = run("list")
    assert text.exit_code == 0
    assert SHIPPED in text.output and "openvinotoolkit/npu_compiler@" in text.output
    listed = json.loads(run("list", "--json").stdout)
    assert [p["name"] for p in listed] == [p.name for p in patching.available_patches()]
    assert {"id", "base_commit", "base_repository", "files", "path"} <= set(listed[0])


def test_cli_check_apply_revert(checkout: Checkout) -> None:
    repo, patch = str(checkout.repo), str(checkout.patch.path)
    result = run("check", repo, "--patch", patch)
    assert result.exit_code == 0
    assert "applicable" in result.stdout and "HEAD is the base commit" in result.stdout

    result = run("apply", repo, "--patch", patch)
    assert result.exit_code == 0 and result.stdout.startswith("applied: ")
    result = run("apply", repo, "--patch", patch)
    assert result.exit_code == 0 and result.stdout.startswith("already applied: ")

    report = json.loads(run("check", repo, "--patch", patch, "--json").stdout)
    assert report["state"] == "applied" and report["head"] == checkout.base
    assert report["patch_id"] == checkout.patch.id

    result = run("revert", repo, "--patch", patch)
    assert result.exit_code == 0 and result.stdout.startswith("reverted: ")
    result = run("revert", repo, "--patch", patch)
    assert result.exit_code == 0 and result.stdout.startswith("not applied: ")

    applied = json.loads(run("apply", repo, "--patch", patch, "--json").stdout)
    assert applied["changed"] and (applied["before"], applied["state"]) == ("applicable", "applied")
    reverted = json.loads(run("revert", repo, "--patch", patch, "--json").stdout)
    assert reverted["changed"] and reverted["state"] == "applicable"
    again = json.loads(run("revert", repo, "--patch", patch, "--json").stdout)
    assert not again["changed"]


def test_cli_check_conflict_exits_1(checkout: Checkout) -> None:
    write(checkout.repo, HPP, STOCK_HPP.replace("_depsMap;", "_depsByOp;"))
    commit_all(checkout.repo, "renamed the member")
    result = run("check", str(checkout.repo), "--patch", str(checkout.patch.path), "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["state"] == "conflict"


def test_cli_errors_are_one_line_and_exit_2(tmp_path: Path, checkout: Checkout) -> None:
    write(checkout.repo, CPP, "// rewritten\n")
    cases = [
        ("check", str(checkout.repo), "--patch", str(checkout.patch.path)),
        ("apply", str(tmp_path), "--patch", str(checkout.patch.path)),
        ("revert", str(checkout.repo), "--patch", "no-such-patch"),
    ]
    for args in cases:
        result = run(*args)
        assert result.exit_code == 2, result.output
        assert result.stdout == ""
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("ovspec: error: ")
