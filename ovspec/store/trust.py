"""Whether a store folder may be used: who owns it, who else can write it, and whether a
link inside it would lead out of its root. ``lstat`` only: nothing here follows a link.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from ovspec.errors import arg
from ovspec.store.layout import ROOT_NAMES, StoreLayout

ENV_TRUST_SHARED = "OVSPEC_TRUST_SHARED_STORE"
# Root folders that must be folders (FORMAT is the one file).
FOLDER_NAMES = tuple(sorted(ROOT_NAMES - {"FORMAT"}))


def trust_shared_from_env() -> bool:
    return os.environ.get(ENV_TRUST_SHARED, "").strip().lower() in {"1", "yes", "true", "on"}


@dataclass(frozen=True)
class FolderReport:
    """What ``inspect`` found. ``foreign``: reasons another user could change the store;
    ``links``: places where a link or a non-folder stands for one of its folders."""

    foreign: tuple[str, ...]
    links: tuple[str, ...]
    bad_paths: tuple[str, ...] = ()  # the paths ``links`` describes, relative to the root


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _private_group(st: os.stat_result) -> bool:
    """Is the file's group the owner's own group with no other member?

    Where each user has a group of their own (USERGROUPS_ENAB, umask 002), group
    write on a user's folder gives nobody else access; anywhere else it does.
    """
    try:
        group = grp.getgrgid(st.st_gid)
        owner = pwd.getpwuid(st.st_uid)
    except KeyError:
        return False
    if group.gr_name != owner.pw_name or owner.pw_gid != st.st_gid:
        return False
    return set(group.gr_mem) <= {owner.pw_name}


def writers(st: os.stat_result, euid: int) -> str | None:
    """Why someone other than ``euid`` can change this file or folder; None if nobody."""
    if st.st_uid != euid:
        return f"owned by {_user_name(st.st_uid)}"
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_IWOTH:
        return f"writable by every user (mode {mode:o})"
    if mode & stat.S_IWGRP and not _private_group(st):
        try:
            group = grp.getgrgid(st.st_gid).gr_name
        except KeyError:
            group = f"gid {st.st_gid}"
        return f"writable by group {group} (mode {mode:o})"
    return None


def _describe_link(path: Path) -> str:
    try:
        return f"a symbolic link (to {os.readlink(path)})"
    except OSError:
        return "a symbolic link"


def inspect(layout: StoreLayout, euid: int | None = None) -> FolderReport:
    """Check the root, its folders, ``blobs/<xx>`` and the index file (lstat only).

    Run when a store opens. What it finds decides: a store another user owns or can
    write is refused unless the caller opts in (then it is used read-only); a link (or a
    file) where one of the store's folders belongs is refused until ``check --fix``.
    """
    euid = os.geteuid() if euid is None else euid
    foreign: list[str] = []
    links: list[str] = []
    bad: list[str] = []
    root = layout.root

    def look(path: Path, want_folder: bool) -> bool:
        """Record what is wrong with ``path``; whether it is a real folder to descend."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        name = "the store folder" if path == root else str(path.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            links.append(f"{name} is {_describe_link(path)}")
            bad.append(name)
            return False
        if want_folder and not stat.S_ISDIR(st.st_mode):
            links.append(f"{name} is a file, not a folder")
            bad.append(name)
            return False
        why = writers(st, euid)
        if why is not None:
            foreign.append(f"{name} is {why}")
        return stat.S_ISDIR(st.st_mode)

    # The root itself may be a link the user chose (it was resolved by the caller).
    if not look(root, want_folder=True):
        return FolderReport(tuple(foreign), tuple(links), tuple(bad))
    look(layout.format_file, want_folder=False)
    for name in FOLDER_NAMES:
        is_folder = look(root / name, want_folder=True)
        if is_folder and name == "models":
            _inspect_models(layout.models, euid, links, bad)
        elif is_folder and name == "blobs":
            with contextlib.suppress(OSError), os.scandir(layout.blobs) as it:
                for entry in it:
                    if entry.is_symlink() or entry.is_dir(follow_symlinks=False):
                        look(Path(entry.path), want_folder=True)
    # A link or a folder in place of the index file is not refused here: the index
    # treats it as damage, moves it (the link, not its target) aside and rebuilds.
    with contextlib.suppress(OSError):
        st = os.lstat(layout.index_db)
        why = writers(st, euid) if stat.S_ISREG(st.st_mode) else None
        if why is not None:
            foreign.append(f"index/{layout.index_db.name} is {why}")
    return FolderReport(tuple(foreign), tuple(links), tuple(bad))


def _inspect_models(models: Path, euid: int, links: list[str], bad: list[str]) -> None:
    """Model folders under models/ (ovspec reads their IR and weights): a link in place
    of one, or one holding a link, a non-file, or anything another user can change, is
    damage like a link at a store folder (issue 29): refused until ``check --fix``
    moves it aside; the model is written again on demand."""
    try:
        found = _lscan(models)
    except OSError:
        return
    for name, st in found:
        path = models / name
        if stat.S_ISLNK(st.st_mode):
            why: str | None = f"is {_describe_link(path)}"
        elif stat.S_ISDIR(st.st_mode):
            why = _model_damage(path, st, euid)
        else:
            continue  # a stray file is never read as a model
        if why is not None:
            links.append(f"models/{name} {why}")
            bad.append(f"models/{name}")


def _model_damage(folder: Path, st: os.stat_result, euid: int) -> str | None:
    """Why a model folder must not be used; None if it may."""
    why = writers(st, euid)
    if why is not None:
        return f"is {why}; another user could change the model"
    try:
        children = _lscan(folder)
    except FileNotFoundError:
        return None  # a writer's staging folder, renamed into place meanwhile
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    for name, cst in children:
        if stat.S_ISLNK(cst.st_mode):
            return f"holds a symbolic link ({name}, to {_link_target(folder / name)})"
        if stat.S_ISDIR(cst.st_mode):
            inner = _model_damage(folder / name, cst, euid)
            if inner is not None:
                return inner
        elif not stat.S_ISREG(cst.st_mode):
            return f"holds {name}, which is not a regular file"
        else:
            who = writers(cst, euid)
            if who is not None:
                return f"holds {name}, {who}; another user could change the model"
    return None


def _lscan(folder: Path) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of a folder's entries, sorted; entries gone meanwhile are skipped."""
    found = []
    with os.scandir(folder) as it:
        for entry in it:
            with contextlib.suppress(FileNotFoundError):
                found.append((entry.name, entry.stat(follow_symlinks=False)))
    return sorted(found)


def _link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def foreign_message(layout: StoreLayout, report: FolderReport) -> str:
    more = f" (and {len(report.foreign) - 1} more)" if len(report.foreign) > 1 else ""
    return (
        f"cache folder {layout.root} is not safe to use: {report.foreign[0]}{more}; another "
        "user could plant blobs or index rows that this process would load. Use your own "
        f"{arg('root')}, remove the others' write access (chmod -R go-w), or pass "
        f"{arg('trust_shared', 'True')} (or set {ENV_TRUST_SHARED}=1) to use it read-only"
    )


def links_message(layout: StoreLayout, report: FolderReport) -> str:
    more = f" (and {len(report.links) - 1} more)" if len(report.links) > 1 else ""
    return (
        f"cache folder {layout.root}: {report.links[0]}{more}; ovspec never follows links "
        "inside its store, nor reads a model another user can change. Run `ovspec cache "
        f"check --fix --cache-dir {layout.root}` to replace it with an empty folder (a model "
        "folder is moved aside and written again; a link's target is left alone)"
    )
