"""Error messages: one text, two audiences (library arguments, command-line options)."""

from __future__ import annotations

import pytest

from ovspec.cli import error_text
from ovspec.errors import BadRequestError, LadderError, OvspecError, arg
from ovspec.ladder import Ladder


def test_a_library_error_names_the_python_argument_and_the_cli_the_option() -> None:
    exc = LadderError(f"lower {arg('ladder')} or {arg('max_new_tokens', '8')}")
    assert str(exc) == "lower ladder= or max_new_tokens=8"
    assert exc.cli_message() == "lower --ladder or --max-new-tokens 8"


def test_the_cli_maps_arguments_whose_option_is_named_otherwise() -> None:
    exc = BadRequestError(f"set {arg('properties', 'NPU_PLATFORM=4000')} or {arg('root')}")
    assert str(exc) == "set properties={'NPU_PLATFORM': '4000'} or root="
    assert error_text(exc) == "set --config NPU_PLATFORM=4000 or --cache-dir"


def test_a_real_library_error_carries_no_cli_flag() -> None:
    with pytest.raises(LadderError) as info:
        Ladder(()).rung_for(1)
    assert "--" not in str(info.value)
    with pytest.raises(LadderError) as info:
        Ladder((1024,)).check_fits(512)
    assert str(info.value).endswith("lower ladder=")
    assert error_text(info.value).endswith("lower --ladder")


def test_plain_messages_are_unchanged() -> None:
    assert str(OvspecError("nothing to render")) == "nothing to render"
    assert OvspecError("nothing to render").cli_message() == "nothing to render"
