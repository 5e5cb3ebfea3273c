"""Compiler source patches shipped with ovspec, and applying them to a git checkout.

A ``Patch`` is read from a ``patches/*.diff`` file whose commentary header names the
upstream repository and base commit; ``check``, ``apply`` and ``revert`` drive
``git apply`` on a checkout of that repository and refuse states they cannot reason about.
"""

from __future__ import annotations

import enum
import importlib.resources
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from ovspec.errors import PatchError

PATCH_SUFFIX = ".diff"

# The canonical files live in patches/ at the repository top (the layout requires it).
# A wheel carries them as ovspec/_patches; a source checkout or an editable install
# reads patches/ beside pyproject.toml (the pyproject check keeps an unrelated
# site-packages/patches folder from being taken for ours).
_PACKAGE_PATCH_DIR = "_patches"
_SOURCE_ROOT = Path(__file__).resolve().parents[2]  # ovspec/trials/patches.py -> the checkout

_DIFF_START = b"diff --git "
# Header lines ovspec reads: "# key: value", one space after "#", key in lower case.
# Indented commentary ("#   Order: ...") never matches.
_HEADER_KEY = re.compile(r"^# ([a-z][a-z0-9-]*): (.+?)\s*$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_REPOSITORY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SHORT = 12


class PatchState(enum.Enum):
    """Where a checkout stands with respect to one patch."""

    APPLICABLE = "applicable"  # touched files as in HEAD; the patch applies cleanly
    APPLIED = "applied"  # touched files are exactly HEAD + this patch, uncommitted
    IN_HEAD = "in-head"  # HEAD itself already contains the change
    CONFLICT = "conflict"  # touched files as in HEAD; the patch does not apply


class BaseRelation(enum.Enum):
    """How the checkout's HEAD relates to the commit the patch was written against."""

    AT_BASE = "at-base"
    DESCENDANT = "descendant"
    # The base commit is not in this repository (a shallow clone, a fork's history):
    # ovspec cannot verify the ancestry and relies on `git apply --check` alone.
    BASE_UNKNOWN = "base-unknown"

    @property
    def verified(self) -> bool:
        return self is not BaseRelation.BASE_UNKNOWN


@dataclass(frozen=True)
class Patch:
    """One patch file: where it comes from, what it touches and its content id."""

    name: str
    path: Path
    base_repository: str  # owner/name on GitHub
    base_commit: str  # full 40-hex commit id
    files: tuple[str, ...]  # repository-relative paths the diff changes, in diff order
    id: str  # xxh3-128 hex of the diff body (from the first "diff --git" on)
    body: bytes = field(repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise PatchError(f"patch name {self.name!r} is not a plain file stem")
        if not _REPOSITORY.match(self.base_repository):
            raise PatchError(
                f"patch {self.name}: base-repository {self.base_repository!r} is not owner/name"
            )
        if not _HEX40.match(self.base_commit):
            raise PatchError(
                f"patch {self.name}: base-commit {self.base_commit!r} is not a full 40-hex"
                " commit id"
            )
        if not self.files:
            raise PatchError(f"patch {self.name}: the diff touches no file")
        if not _HEX32.match(self.id):
            raise PatchError(f"patch {self.name}: id {self.id!r} is not 32 hex digits")

    @classmethod
    def from_file(cls, path: Path) -> Patch:
        """Read and validate a patch file; the header must name the base repository and commit."""
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise PatchError(f"cannot read patch file {path}: {exc.strerror or exc}") from exc
        if data.startswith(_DIFF_START):
            start = 0
        else:
            found = data.find(b"\n" + _DIFF_START)
            if found < 0:
                raise PatchError(f"patch file {path} has no 'diff --git' line: not a git diff")
            start = found + 1
        header = _parse_header(data[:start].decode("utf-8", errors="replace"), path)
        body = data[start:]
        name = path.name.removesuffix(PATCH_SUFFIX)
        declared = header.get("ovspec-patch")
        if declared is not None and declared != name:
            raise PatchError(
                f"patch file {path} declares the name {declared!r}; rename the file or the header"
            )
        for key in ("base-repository", "base-commit"):
            if key not in header:
                raise PatchError(
                    f"patch file {path} has no '# {key}: ...' line before its first 'diff --git'"
                )
        return cls(
            name=name,
            path=path,
            base_repository=header["base-repository"],
            base_commit=header["base-commit"].lower(),
            files=_touched_files(body, path),
            id=xxhash.xxh3_128_hexdigest(body),
            body=body,
        )

    def describe(self) -> str:
        files = ", ".join(self.files)
        return (
            f"{self.name}  id {self.id[:16]}  base {self.base_repository}"
            f"@{self.base_commit[:_SHORT]}  files {files}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "id": self.id,
            "path": str(self.path),
            "base_repository": self.base_repository,
            "base_commit": self.base_commit,
            "files": list(self.files),
        }


@dataclass(frozen=True)
class PatchCheck:
    """What ``check`` found in one checkout for one patch."""

    patch: Patch
    source_dir: Path
    head: str
    base: BaseRelation
    state: PatchState
    detail: str  # git's own words when the patch does not apply, else ""

    def describe(self) -> str:
        where = {
            BaseRelation.AT_BASE: "HEAD is the base commit",
            BaseRelation.DESCENDANT: (
                f"HEAD {self.head[:_SHORT]} descends from the base commit "
                f"{self.patch.base_commit[:_SHORT]}"
            ),
            BaseRelation.BASE_UNKNOWN: (
                f"base commit {self.patch.base_commit[:_SHORT]} is not in this repository"
                " (shallow clone?): compatibility not verified"
            ),
        }[self.base]
        what = {
            PatchState.APPLICABLE: "applicable: the patch applies cleanly",
            PatchState.APPLIED: "applied: the touched files are HEAD + this patch (uncommitted)",
            PatchState.IN_HEAD: "in HEAD: the change is already committed",
            PatchState.CONFLICT: f"conflict: the patch does not apply ({self.detail})",
        }[self.state]
        return f"{self.patch.name} in {self.source_dir}: {what}; {where}"

    def to_json(self) -> dict[str, object]:
        return {
            "patch": self.patch.name,
            "patch_id": self.patch.id,
            "source_dir": str(self.source_dir),
            "head": self.head,
            "base_commit": self.patch.base_commit,
            "base_relation": self.base.value,
            "base_verified": self.base.verified,
            "state": self.state.value,
            "detail": self.detail,
        }


# --- finding patches -------------------------------------------------------------


def patch_dir() -> Path | None:
    """The folder the shipped patches are read from, or None when none is installed."""
    packaged = importlib.resources.files("ovspec") / _PACKAGE_PATCH_DIR
    # Wheels are installed as plain files, so the traversable is a real path here.
    if packaged.is_dir():
        return Path(str(packaged))
    source = _SOURCE_ROOT / "patches"
    if (_SOURCE_ROOT / "pyproject.toml").is_file() and source.is_dir():
        return source
    return None


def available_patches() -> list[Patch]:
    """The patches shipped with ovspec, sorted by name."""
    folder = patch_dir()
    if folder is None:
        return []
    return [Patch.from_file(p) for p in sorted(folder.glob(f"*{PATCH_SUFFIX}"))]


def resolve_patch(name_or_path: str | None) -> Patch:
    """A shipped patch by name (None: the first one), or a patch file given by its path."""
    if name_or_path is not None and (
        os.sep in name_or_path or "/" in name_or_path or name_or_path.endswith(PATCH_SUFFIX)
    ):
        path = Path(name_or_path)
        if path.is_file():
            return Patch.from_file(path)
        if os.sep in name_or_path or "/" in name_or_path:
            raise PatchError(f"patch file {path} does not exist")
    patches = available_patches()
    if not patches:
        raise PatchError(
            "no patches are installed with ovspec (expected patches/*.diff); reinstall ovspec"
            " or pass a patch file path"
        )
    if name_or_path is None:
        return patches[0]
    wanted = name_or_path.removesuffix(PATCH_SUFFIX)
    for p in patches:
        if p.name == wanted:
            return p
    names = ", ".join(p.name for p in patches)
    raise PatchError(f"no shipped patch named {name_or_path!r}; available: {names}")


# --- checking, applying, reverting ---------------------------------------------------


def check(patch: Patch, source_dir: Path) -> PatchCheck:
    """Where ``source_dir`` stands with respect to ``patch``; raises when it cannot tell.

    ``source_dir`` must be the top of a git work tree whose HEAD is the patch's base
    commit or a descendant of it (when the base commit is absent, e.g. in a shallow
    clone, ``git apply --check`` alone decides and the result says so). The files the
    patch touches must be either as in HEAD or exactly HEAD + this patch: any other
    uncommitted change in them is refused, naming the files. Uncommitted changes in
    other files are allowed, since the patch neither reads nor writes them.
    """
    top = _work_tree_top(source_dir)
    head = _head(top)
    _require_files(patch, top)
    base = _base_relation(patch, top, head)
    head_blobs = _head_blobs(patch, top)
    tree_blobs = _work_tree_blobs(patch, top)

    if tree_blobs == head_blobs:
        forward = _git(top, "apply", "--check", str(patch.path.resolve()))
        if forward.returncode == 0:
            return PatchCheck(patch, top, head, base, PatchState.APPLICABLE, "")
        reverse = _git(top, "apply", "--check", "--reverse", str(patch.path.resolve()))
        if reverse.returncode == 0:
            return PatchCheck(patch, top, head, base, PatchState.IN_HEAD, "")
        return PatchCheck(patch, top, head, base, PatchState.CONFLICT, _first_error(forward))

    patched_blobs = _patched_head_blobs(patch, top)
    if patched_blobs is not None and tree_blobs == patched_blobs:
        return PatchCheck(patch, top, head, base, PatchState.APPLIED, "")
    dirty = [f for f in patch.files if tree_blobs[f] != head_blobs[f]]
    raise PatchError(
        f"{top} has uncommitted changes in {', '.join(dirty)} that are not (exactly) patch"
        f" {patch.name}; commit or stash them (git -C {top} stash) and retry"
    )


def apply(patch: Patch, source_dir: Path) -> PatchCheck:
    """Apply ``patch`` to the work tree (not the index); a no-op when already applied."""
    before = check(patch, source_dir)
    if before.state in (PatchState.APPLIED, PatchState.IN_HEAD):
        return before
    if before.state is PatchState.CONFLICT:
        raise PatchError(
            f"patch {patch.name} does not apply to {before.source_dir} at HEAD "
            f"{before.head[:_SHORT]}: {before.detail}; check out the base commit "
            f"{patch.base_commit} or rebase the patch"
        )
    result = _git(before.source_dir, "apply", str(patch.path.resolve()))
    if result.returncode != 0:
        raise PatchError(
            f"git apply of {patch.name} failed in {before.source_dir}: {_first_error(result)}"
        )
    return _expect(patch, before.source_dir, PatchState.APPLIED, "apply")


def revert(patch: Patch, source_dir: Path) -> PatchCheck:
    """Undo an uncommitted ``apply``; a no-op when the patch is not applied."""
    before = check(patch, source_dir)
    if before.state is PatchState.APPLICABLE:
        return before
    if before.state is PatchState.IN_HEAD:
        raise PatchError(
            f"patch {patch.name} is committed in HEAD {before.head[:_SHORT]} of"
            f" {before.source_dir}; undo that commit with git revert, not ovspec"
        )
    if before.state is PatchState.CONFLICT:
        raise PatchError(
            f"patch {patch.name} is neither applied to nor applicable in {before.source_dir}"
            f" ({before.detail}); nothing to revert"
        )
    result = _git(before.source_dir, "apply", "--reverse", str(patch.path.resolve()))
    if result.returncode != 0:
        raise PatchError(
            f"git apply --reverse of {patch.name} failed in {before.source_dir}:"
            f" {_first_error(result)}"
        )
    return _expect(patch, before.source_dir, PatchState.APPLICABLE, "revert")


# --- helpers ------------------------------------------------------------------------


def _parse_header(text: str, path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        match = _HEADER_KEY.match(line)
        if match is None:
            continue
        key, value = match.group(1), match.group(2)
        if key in values:
            raise PatchError(f"patch file {path} repeats the header key {key!r}")
        values[key] = value
    return values


def _touched_files(body: bytes, path: Path) -> tuple[str, ...]:
    files: list[str] = []
    for raw in body.splitlines():
        if not raw.startswith(_DIFF_START):
            continue
        line = raw.decode("utf-8", errors="replace")
        parts = line[len("diff --git ") :].split(" b/")
        if line[len("diff --git ") :].startswith('"') or len(parts) != 2:
            raise PatchError(f"patch file {path}: cannot read the paths of {line!r}")
        name = parts[1]
        if name not in files:
            files.append(name)
    return tuple(files)


def _git(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0", **(env or {})}
    try:
        return subprocess.run(
            ["git", *args],
            cwd=cwd,
            env=full_env,
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError as exc:
        raise PatchError("git is not installed or not on PATH; install git and retry") from exc


def _first_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = [ln.strip() for ln in (result.stderr or result.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(("error:", "fatal:"))]
    return (errors or lines or [f"git exited with {result.returncode}"])[0]


def _work_tree_top(source_dir: Path) -> Path:
    if not source_dir.is_dir():
        raise PatchError(f"{source_dir} is not a directory; pass the top of a git checkout")
    result = _git(source_dir, "rev-parse", "--show-toplevel")
    if result.returncode != 0:
        raise PatchError(
            f"{source_dir} is not a git checkout ({_first_error(result)}); clone the patch's"
            " base repository and check out its base commit"
        )
    top = Path(result.stdout.strip()).resolve()
    if top != source_dir.resolve():
        # git apply run from a subdirectory silently skips paths outside it.
        raise PatchError(
            f"{source_dir} is inside the git work tree {top} but not its top; pass {top}"
        )
    return top


def _head(top: Path) -> str:
    result = _git(top, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    if result.returncode != 0:
        raise PatchError(f"{top} has no commit checked out; check out the patch's base commit")
    return result.stdout.strip()


def _require_files(patch: Patch, top: Path) -> None:
    listed = _git(top, "ls-tree", "-z", "--name-only", "HEAD", "--", *patch.files)
    present = {p for p in listed.stdout.split("\0") if p}
    missing = [f for f in patch.files if f not in present]
    if missing:
        raise PatchError(
            f"HEAD of {top} lacks files patch {patch.name} changes ({', '.join(missing)}):"
            f" not a checkout of {patch.base_repository} at a compatible commit"
        )


def _base_relation(patch: Patch, top: Path, head: str) -> BaseRelation:
    if head == patch.base_commit:
        return BaseRelation.AT_BASE
    known = _git(top, "cat-file", "-e", f"{patch.base_commit}^{{commit}}")
    if known.returncode != 0:
        return BaseRelation.BASE_UNKNOWN
    ancestor = _git(top, "merge-base", "--is-ancestor", patch.base_commit, head)
    if ancestor.returncode == 0:
        return BaseRelation.DESCENDANT
    if ancestor.returncode == 1:
        raise PatchError(
            f"HEAD {head[:_SHORT]} of {top} does not descend from patch {patch.name}'s base"
            f" commit {patch.base_commit}; check it out (git -C {top} checkout"
            f" {patch.base_commit}) or a descendant of it"
        )
    raise PatchError(f"git merge-base failed in {top}: {_first_error(ancestor)}")


def _head_blobs(patch: Patch, top: Path) -> dict[str, str]:
    return _listed_blobs(_git(top, "ls-tree", "-z", "HEAD", "--", *patch.files), patch, 2)


def _work_tree_blobs(patch: Patch, top: Path) -> dict[str, str]:
    blobs: dict[str, str] = {}
    existing = [f for f in patch.files if (top / f).is_file()]
    if existing:
        result = _git(top, "hash-object", "--", *existing)
        if result.returncode != 0:
            raise PatchError(f"git hash-object failed in {top}: {_first_error(result)}")
        blobs.update(zip(existing, result.stdout.split(), strict=True))
    for f in patch.files:
        blobs.setdefault(f, "<missing>")
    return blobs


def _patched_head_blobs(patch: Patch, top: Path) -> dict[str, str] | None:
    """Blob ids of the touched files in HEAD + patch, or None when it does not apply to HEAD."""
    # A throwaway index: HEAD's tree with the patch applied, never touching the work tree.
    with tempfile.TemporaryDirectory(prefix="ovspec-patch-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        read = _git(top, "read-tree", "HEAD", env=env)
        if read.returncode != 0:
            raise PatchError(f"git read-tree HEAD failed in {top}: {_first_error(read)}")
        if _git(top, "apply", "--cached", str(patch.path.resolve()), env=env).returncode != 0:
            return None
        staged = _git(top, "ls-files", "-z", "--stage", "--", *patch.files, env=env)
    return _listed_blobs(staged, patch, 1)


def _listed_blobs(
    result: subprocess.CompletedProcess[str], patch: Patch, object_field: int
) -> dict[str, str]:
    """Blob id per touched file from a git -z listing of "<meta>\t<path>\0" entries, the id
    being field ``object_field`` of meta: 2 in ls-tree's "<mode> <type> <object>", 1 in
    ls-files --stage's "<mode> <object> <stage>". A file not listed is "<missing>"."""
    blobs: dict[str, str] = {}
    for entry in (e for e in result.stdout.split("\0") if e):
        meta, name = entry.split("\t", 1)
        blobs[name] = meta.split()[object_field]
    for f in patch.files:
        blobs.setdefault(f, "<missing>")
    return blobs


def _expect(patch: Patch, top: Path, wanted: PatchState, verb: str) -> PatchCheck:
    after = check(patch, top)
    if after.state is not wanted:
        raise PatchError(
            f"after {verb} of {patch.name}, {top} is {after.state.value}, not {wanted.value};"
            f" inspect it with git -C {top} diff"
        )
    return after
