"""Optional weight compression (nncf) applied to the dynamic IR before specializing.

A ``Compression`` is a value: parsed from ``--compress``, canonicalized into the
blob key (with nncf's version, since its output can change between releases).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from ovspec.errors import BadRequestError

if TYPE_CHECKING:
    import openvino as ov


class CompressionMode(Enum):
    NONE = "none"
    INT8 = "int8"  # int8 symmetric, per output channel
    INT4 = "int4"  # int4 symmetric, grouped


DEFAULT_INT4_GROUP_SIZE = 128
# int4 groups that weight-compression kernels use: powers of two (issue 29: int4:7 and
# int4:99999999999 were taken).
INT4_GROUP_SIZES = tuple(2**k for k in range(4, 13))  # 16 .. 4096


@dataclass(frozen=True)
class Compression:
    mode: CompressionMode = CompressionMode.NONE
    group_size: int | None = None  # int4 only

    def __post_init__(self) -> None:
        if self.mode is CompressionMode.INT4:
            if self.group_size is None or self.group_size <= 0:
                raise BadRequestError("int4 compression needs a positive group size, e.g. int4:128")
            if self.group_size not in INT4_GROUP_SIZES:
                raise BadRequestError(
                    f"int4 group size {self.group_size} is not a power of two from "
                    f"{INT4_GROUP_SIZES[0]} to {INT4_GROUP_SIZES[-1]}; e.g. int4:128"
                )
        elif self.group_size is not None:
            raise BadRequestError(f"{self.mode.value} compression takes no group size")

    @classmethod
    def parse(cls, text: str) -> Compression:
        """``none``, ``int8``, ``int4`` or ``int4:GROUP``."""
        mode_text, _, group_text = text.strip().lower().partition(":")
        try:
            mode = CompressionMode(mode_text)
        except ValueError:
            choices = ", ".join(m.value for m in CompressionMode)
            raise BadRequestError(
                f"unknown compression {text!r}; choose {choices} (int4:GROUP for a group size)"
            ) from None
        if mode is CompressionMode.INT4:
            if group_text and not group_text.isdigit():
                raise BadRequestError(f"int4 group size {group_text!r} is not a positive integer")
            return cls(mode, int(group_text) if group_text else DEFAULT_INT4_GROUP_SIZE)
        if group_text:
            raise BadRequestError(f"{mode.value} compression takes no group size (got {text!r})")
        return cls(mode)

    def __str__(self) -> str:
        if self.mode is CompressionMode.INT4:
            return f"int4:{self.group_size}"
        return str(self.mode.value)

    @property
    def canonical(self) -> str:
        """Key text: the settings and the nncf version that applies them."""
        if self.mode is CompressionMode.NONE:
            return "none"
        import nncf

        version = str(nncf.__version__)
        return f"{self}:sym:ratio=1.0:fallback=adjust:nncf={version}"

    def apply(self, model: ov.Model) -> ov.Model:
        """Compress ``model``'s weights (in place, as nncf does) and return it."""
        if self.mode is CompressionMode.NONE:
            return model
        import nncf

        # nncf logs a statistics table at INFO; ovspec's own output is the report.
        nncf.set_log_level(logging.ERROR)
        if self.mode is CompressionMode.INT8:
            return nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_SYM)
        advanced = nncf.AdvancedCompressionParameters(
            group_size_fallback_mode=nncf.GroupSizeFallbackMode.ADJUST
        )
        return nncf.compress_weights(
            model,
            mode=nncf.CompressWeightsMode.INT4_SYM,
            group_size=self.group_size,
            ratio=1.0,
            advanced_parameters=advanced,
        )
