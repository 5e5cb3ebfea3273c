"""Issue 29, item 15: every numeric option of every command has a range, and a value
outside it is one line on stderr and exit 2 through the real command.

The options are found from click's own parameter objects, so an option added later
without both bounds (or with a value type this file does not know) fails here."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import ovspec.cli.commands  # noqa: F401 - registers the command modules
from ovspec.cli import cli
from ovspec.cli.options import CompressionType, IntListType, KeyValueType, LadderType
from ovspec.cli.plan import RungValuesType
from ovspec.cli.units import SizeType

# Value types that hold no number: nothing to bound.
NOT_NUMBERS = (
    click.types.StringParamType,
    click.types.BoolParamType,
    click.Choice,
    click.Path,
    KeyValueType,
)
# ovspec's own value types that hold numbers: values each must refuse, and a word its
# one-line error must contain.
OWN_TYPES: dict[type[click.ParamType], tuple[tuple[str, ...], str]] = {
    LadderType: (("99999999999", "0", "4194305", "5000K"), "ladder"),
    CompressionType: (("int4:7", "int4:99999999999", "int4:0", "int4:8192"), "int4"),
    SizeType: (("1.5", "4000", "100000000000000000000000000G", "0B", "0.5B"), "size"),
    RungValuesType: (("inf", "nan", "-1", "1e7", "32=1e300"), "finite number >= 0"),
    # Token ids are checked against the model's vocabulary once it is open.
    IntListType: (("5,99999999999999999999999", "5,2048"), "vocabulary"),
}


def commands() -> Iterator[tuple[list[str], click.Command]]:
    def walk(command: click.Command, path: list[str]) -> Iterator[tuple[list[str], click.Command]]:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield path, command

    return walk(cli, [])


def out_of_range(param: click.Parameter) -> tuple[list[str], str] | None:
    """Values ``param`` must refuse and a word of the error; None if it holds no number.
    A type not classified here fails the test; a missing bound is ``check_bounded``'s."""
    kind = param.type
    needle = param.opts[0] if isinstance(param, click.Option) else param.name or ""
    if isinstance(kind, click.types.IntParamType):
        low, high = getattr(kind, "min", None), getattr(kind, "max", None)
        below = [] if low is None else [str(int(low) - 1)]
        above = [str(2**70)] if high is None else [str(int(high) + 1), str(2**70)]
        return [*below, *above], needle
    if isinstance(kind, click.types.FloatParamType):
        low, high = getattr(kind, "min", None), getattr(kind, "max", None)
        values = ["inf", "-inf", "nan", "1e300"]
        if low is not None:
            values.append(str(low if kind.min_open else low - max(1.0, abs(low))))  # type: ignore[attr-defined]
        if high is not None:
            values.append(str(high * 10 + 1))
        return values, needle
    if isinstance(kind, NOT_NUMBERS):
        return None
    for own, (values, word) in OWN_TYPES.items():
        if isinstance(kind, own):
            return list(values), word
    raise AssertionError(f"{param.opts}: classify its type {type(kind).__name__} in this test")


def check_bounded(param: click.Parameter) -> None:
    """A parameter of click's number types must be a range with both bounds."""
    kind = param.type
    if isinstance(kind, (click.types.IntParamType, click.types.FloatParamType)):
        if not isinstance(kind, (click.IntRange, click.FloatRange)):
            raise AssertionError(f"{param.opts} takes a number without a range")
        if kind.min is None or kind.max is None:
            raise AssertionError(f"{param.opts} has no range on one side")


def required_args(command: click.Command, model: Path, skip: click.Parameter) -> list[str]:
    """Valid values for the command's required parameters (MODEL a real folder), so that
    only the value under test can fail."""
    args: list[str] = []
    for param in command.params:
        if param is skip or not param.required:
            continue
        value = str(model) if param.name == "model" else "32"
        args += [value] if isinstance(param, click.Argument) else [param.opts[0], value]
    return args


CASES = [
    pytest.param(path, param.name, value, needle, id=f"{' '.join(path)} {param.name}={value}")
    for path, command in commands()
    for param in command.params
    if (found := out_of_range(param)) is not None
    for value, needle in [(v, found[1]) for v in found[0]]
]


def test_every_numeric_option_is_walked() -> None:
    names = {(" ".join(path), name) for path, name, *_ in (c.values for c in CASES)}
    # The options issue 29 found without a range are among them.
    for expected in [
        ("generate", "temperature"),
        ("generate", "stop_token_ids"),
        ("generate", "rng_seed"),
        ("build", "chunk_tokens"),
        ("build", "jobs"),
        ("build", "compression"),
        ("cache gc", "size_limit_bytes"),
        ("ab-compile", "seed"),
    ]:
        assert expected in names
    assert len(names) >= 45


@pytest.mark.parametrize(("path", "name", "value", "needle"), CASES)
def test_an_out_of_range_value_is_one_line_and_exit_2(
    qwen2_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    path: list[str],
    name: str,
    value: str,
    needle: str,
) -> None:
    command = cli
    for part in path:
        assert isinstance(command, click.Group)
        command = command.commands[part]
    param = next(p for p in command.params if p.name == name)
    args = [*path, *required_args(command, qwen2_dir, param)]
    args += [value] if isinstance(param, click.Argument) else [param.opts[0], value]
    if any(p.name == "cache_dir" for p in command.params):
        args += ["--cache-dir", str(tmp_path / "store")]
    monkeypatch.chdir(tmp_path)  # ab-compile writes its record in the working folder
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, (args, result.output)
    assert "Traceback" not in result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("ovspec: error: ")
    assert needle in result.stderr, result.stderr
    assert not (tmp_path / "store" / "blobs").exists() or not any(
        (tmp_path / "store" / "blobs").rglob("*.blob")
    )


def test_defaults_are_in_range() -> None:
    for path, command in commands():
        for param in command.params:
            default = param.default
            if out_of_range(param) is None or default is None or not isinstance(default, str | int):
                continue
            if isinstance(default, float) and not math.isfinite(default):
                raise AssertionError(f"{path} {param.name} default {default}")
            param.type.convert(default, param, None)


def test_every_numeric_option_has_both_bounds() -> None:
    for _path, command in commands():
        for param in command.params:
            check_bounded(param)


def test_a_new_option_without_a_range_fails_this_walk() -> None:
    @click.command()
    @click.option("--count", type=int)
    @click.option("--ratio", type=click.FloatRange(min=0))
    @click.option("--level", type=click.IntRange(1, 9))
    def fresh(count: int, ratio: float, level: int) -> None: ...

    count, ratio, level = fresh.params
    with pytest.raises(AssertionError, match="without a range"):
        check_bounded(count)
    with pytest.raises(AssertionError, match="no range on one side"):
        check_bounded(ratio)
    check_bounded(level)
    assert out_of_range(count) is not None and "nan" in out_of_range(ratio)[0]  # type: ignore[index]
