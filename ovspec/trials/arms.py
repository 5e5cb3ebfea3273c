"""Arms of an A/B compile trial: everything that may differ between two compilers.

Owns ``ArmSpec`` (interpreter, Python and library search folders, environment,
compile properties), its parsing from command-line options or an arms TOML file, and
the environment a worker process of the arm is started with. No OpenVINO import.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ovspec.errors import BadRequestError, arg
from ovspec.stats.orders import Arm

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

# How a compiler engineer points an arm at an OpenVINO build (the pip wheel's
# extension and libraries carry RPATH=$ORIGIN, which the loader searches *before*
# LD_LIBRARY_PATH, so LD_LIBRARY_PATH alone cannot swap the wheel's libopenvino or
# the plugins and compiler it loads from its own folder):
#   - ``python``: the interpreter of a virtual environment whose ``openvino`` package
#     is the build under test (a copy of a venv with a patched
#     ``openvino/libs/libopenvino_intel_npu_compiler.so`` is the simplest patched arm);
#   - ``pythonpath``: folders put first on PYTHONPATH, e.g. a source build's
#     ``<install>/python`` (what setupvars.sh exports);
#   - ``libs``: folders put first on LD_LIBRARY_PATH, e.g. ``<install>/runtime/lib/intel64``
#     for builds without RPATH, or a folder holding a compiler found by bare name.
# Whatever is given, each run records the libraries that actually loaded.
ARMS_TOML_KEYS = ("label", "python", "pythonpath", "libs", "env", "config")

# Set through ``pythonpath``/``libs``, never through ``env``: the harness composes them.
RESERVED_ENV = frozenset({"PYTHONPATH", "LD_LIBRARY_PATH", "PYTHONHOME"})

# Properties that would turn a timed compile into a cache load.
CACHE_PROPERTIES = frozenset({"CACHE_DIR"})

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_LABEL = 40


def _pairs(items: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Last value wins per key, sorted by key: the canonical form of a mapping."""
    return tuple(sorted(dict(items).items()))


@dataclass(frozen=True)
class ArmSpec:
    """One arm. ``properties`` are the full compile properties (common ones merged in).

    ``python`` is kept as given (made absolute, not resolved): a venv's interpreter is a
    symlink to the base one, and resolving it would drop the venv.
    """

    arm: Arm
    label: str
    python: Path = field(default_factory=lambda: Path(sys.executable))
    pythonpath: tuple[Path, ...] = ()
    libs: tuple[Path, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    properties: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        who = f"arm {self.arm.value}"
        if not self.label.strip() or len(self.label) > _MAX_LABEL or "\n" in self.label:
            raise BadRequestError(
                f"{who} label {self.label!r} must be 1..{_MAX_LABEL} characters on one line"
            )
        for key, _ in self.env:
            if not _ENV_NAME.match(key):
                raise BadRequestError(f"{who} environment variable name {key!r} is not valid")
            if key in RESERVED_ENV:
                raise BadRequestError(
                    f"{who} sets {key} through env; give folders with {arg('pythonpath')} and "
                    f"{arg('libs')} instead, the harness composes that variable"
                )
        for key, value in self.properties:
            if not key.strip() or not value.strip():
                raise BadRequestError(f"{who} compile property {key!r}={value!r} is empty")
            if key.upper() in CACHE_PROPERTIES:
                raise BadRequestError(
                    f"{who} sets {key}: an A/B compile trial times compiles, never cache "
                    "loads; remove it"
                )
        if [k for k, _ in self.env] != sorted({k for k, _ in self.env}):
            raise BadRequestError(f"{who} env is not in canonical form; build it with make_arm")
        if [k for k, _ in self.properties] != sorted({k for k, _ in self.properties}):
            raise BadRequestError(f"{who} properties are not in canonical form; use make_arm")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; what a results file's header records of the arm."""
        return {
            "arm": self.arm.value,
            "label": self.label,
            "python": str(self.python),
            "pythonpath": [str(p) for p in self.pythonpath],
            "libs": [str(p) for p in self.libs],
            "env": dict(self.env),
            "config": dict(self.properties),
        }

    def describe(self) -> str:
        """One human line: label, interpreter, folders, env and properties."""
        parts = [f"python {self.python}"]
        if self.pythonpath:
            parts.append("pythonpath " + ":".join(map(str, self.pythonpath)))
        if self.libs:
            parts.append("libs " + ":".join(map(str, self.libs)))
        env = " ".join(f"{k}={v}" for k, v in self.env)
        props = " ".join(f"{k}={v}" for k, v in self.properties)
        parts.append(f"env {env or '-'}")
        parts.append(f"config {props or '-'}")
        return "; ".join(parts)

    def process_env(self, base: Mapping[str, str], package_path: Path) -> dict[str, str]:
        """The environment of a worker process of this arm.

        ``base`` is the harness's environment minus its PYTHONPATH (an arm sees only the
        folders it names), then: PYTHONPATH = the arm's folders + ``package_path`` (a
        folder exposing only the ``ovspec`` package, so both arms run the same worker
        code), LD_LIBRARY_PATH = the arm's folders + the inherited value, then ``env``.
        """
        out = {k: v for k, v in base.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        out["PYTHONPATH"] = os.pathsep.join([*map(str, self.pythonpath), str(package_path)])
        inherited = base.get("LD_LIBRARY_PATH", "")
        libs = [*map(str, self.libs), *([inherited] if inherited else [])]
        if libs:
            out["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
        else:
            out.pop("LD_LIBRARY_PATH", None)
        out.update(self.env)
        return out


def _folder(who: str, what: str, value: str | Path, relative_to: Path | None) -> Path:
    path = Path(value).expanduser()
    if relative_to is not None and not path.is_absolute():
        path = relative_to / path
    path = path.absolute()
    if not path.is_dir():
        raise BadRequestError(f"{who} {what} folder {path} does not exist")
    return path


def _interpreter(who: str, value: str | Path | None, relative_to: Path | None) -> Path:
    if value is None:
        return Path(sys.executable)
    path = Path(value).expanduser()
    if relative_to is not None and not path.is_absolute():
        path = relative_to / path
    path = path.absolute()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise BadRequestError(
            f"{who} python {path} is not an executable file; give a venv's bin/python"
        )
    return path


def make_arm(
    arm: Arm,
    *,
    label: str | None = None,
    python: str | Path | None = None,
    pythonpath: Iterable[str | Path] = (),
    libs: Iterable[str | Path] = (),
    env: Iterable[tuple[str, str]] = (),
    properties: Iterable[tuple[str, str]] = (),
    common_properties: Iterable[tuple[str, str]] = (),
    relative_to: Path | None = None,
) -> ArmSpec:
    """An ``ArmSpec`` from loose values, checking that its files exist.

    ``properties`` override ``common_properties`` key by key; relative paths are taken
    from ``relative_to`` (an arms file's folder) when given.
    """
    who = f"arm {arm.value}"
    return ArmSpec(
        arm=arm,
        label=label if label is not None else arm.value,
        python=_interpreter(who, python, relative_to),
        pythonpath=tuple(_folder(who, "pythonpath", p, relative_to) for p in pythonpath),
        libs=tuple(_folder(who, "libs", p, relative_to) for p in libs),
        env=_pairs(env),
        properties=_pairs([*common_properties, *properties]),
    )


def _toml_text(where: str, key: str, value: object) -> str:
    if isinstance(value, bool):
        return "YES" if value else "NO"
    if isinstance(value, str | int | float):
        return str(value)
    raise BadRequestError(f"{where} {key} = {value!r} is not a string, number or boolean")


def _toml_paths(where: str, key: str, value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise BadRequestError(f"{where} {key} must be a path or a list of paths")


def _toml_table(where: str, key: str, value: object) -> list[tuple[str, str]]:
    if not isinstance(value, dict):
        raise BadRequestError(f"{where} {key} must be a table of NAME = value")
    return [(str(k), _toml_text(f"{where}.{key}", str(k), v)) for k, v in value.items()]


def _arm_from_table(
    arm: Arm, table: object, source: Path, common: Iterable[tuple[str, str]]
) -> ArmSpec:
    where = f"[{arm.value.lower()}] of {source}"
    if not isinstance(table, dict):
        raise BadRequestError(f"{where} must be a table")
    unknown = sorted(set(table) - set(ARMS_TOML_KEYS))
    if unknown:
        raise BadRequestError(
            f"unknown key {unknown[0]!r} in {where}; expected {', '.join(ARMS_TOML_KEYS)}"
        )
    label = table.get("label")
    python = table.get("python")
    if label is not None and not isinstance(label, str):
        raise BadRequestError(f"{where} label must be a string")
    if python is not None and not isinstance(python, str):
        raise BadRequestError(f"{where} python must be a path")
    return make_arm(
        arm,
        label=label,
        python=python,
        pythonpath=_toml_paths(where, "pythonpath", table.get("pythonpath", [])),
        libs=_toml_paths(where, "libs", table.get("libs", [])),
        env=_toml_table(where, "env", table.get("env", {})),
        properties=_toml_table(where, "config", table.get("config", {})),
        common_properties=common,
        relative_to=source.parent,
    )


def load_arms(
    path: Path, common_properties: Iterable[tuple[str, str]] = ()
) -> tuple[ArmSpec, ArmSpec]:
    """Arms A and B from a TOML file with ``[a]`` and ``[b]`` tables.

    Keys per table: ``label``, ``python``, ``pythonpath`` and ``libs`` (a path or a list;
    relative to the file), ``env`` and ``config`` (tables of NAME = value).
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadRequestError(f"cannot read arms file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise BadRequestError(f"arms file {path} is not valid TOML: {exc}") from exc
    extra = sorted(set(data) - {"a", "b"})
    if extra:
        raise BadRequestError(f"arms file {path} has table [{extra[0]}]; only [a] and [b] exist")
    missing = [name for name in ("a", "b") if name not in data]
    if missing:
        raise BadRequestError(f"arms file {path} has no [{missing[0]}] table; give [a] and [b]")
    common = tuple(common_properties)
    return (
        _arm_from_table(Arm.A, data["a"], path, common),
        _arm_from_table(Arm.B, data["b"], path, common),
    )
