"""A graph compiled as two halves side by side and run as one (``ir/partition.py``).

The halves compile at once, on two threads (a CPU compile keeps one core busy); a request
runs the front, binds the tensors it hands off to the back's inputs and runs the back. To
a caller it is a compiled model: inputs and outputs by name, requests, state.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeAlias

import openvino as ov

from ovspec.ir.partition import GraphHalves

if TYPE_CHECKING:
    from ovspec.compile.sharedhead import CutCompiledModel


class ComposedModel:
    """What a model run as several compiled ones shows its callers: the ports of the
    whole (``_inputs``, ``_outputs``, set by the subclass), found by name."""

    _inputs: list[Any]
    _outputs: list[Any]

    @property
    def inputs(self) -> list[Any]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[Any]:
        return list(self._outputs)

    def input(self, name: str) -> Any:
        return _port(self._inputs, name)

    def output(self, name: str) -> Any:
        return _port(self._outputs, name)


class HalvedCompiledModel(ComposedModel):
    """The two compiled halves; what ``Session`` and ``warm_up`` use of a compiled model.

    The front's last ``len(handoff)`` outputs are its hand-offs, in order (they may carry
    names of the whole graph's tensors: they are told apart by position, not name)."""

    def __init__(
        self, front: ov.CompiledModel, back: ov.CompiledModel, handoff: tuple[str, ...]
    ) -> None:
        self.front = front
        self.back = back
        self.handoff = handoff
        self.own_front_outputs = len(front.outputs) - len(handoff)
        passed = set(handoff)
        front_inputs = {port.get_any_name() for port in front.inputs}
        self._inputs = [
            *front.inputs,
            *(
                p
                for p in back.inputs
                if p.get_any_name() not in passed and p.get_any_name() not in front_inputs
            ),
        ]
        self._outputs = [*front.outputs[: self.own_front_outputs], *back.outputs]

    def create_infer_request(self) -> HalvedInferRequest:
        return HalvedInferRequest(self)


# What the loader and a session hold: one compiled model, or two halves run as one, or
# either run between the shared embedding and LM head (compile/sharedhead.py).
CompiledGraph: TypeAlias = "ov.CompiledModel | HalvedCompiledModel | CutCompiledModel"


class HalvedInferRequest:
    """Runs the front, then the back on what the front handed off."""

    def __init__(self, compiled: HalvedCompiledModel) -> None:
        self._compiled = compiled
        self._front = compiled.front.create_infer_request()
        self._back = compiled.back.create_infer_request()
        own = compiled.own_front_outputs
        # (front output index, back input port) per hand-off
        self._handoff = [
            (own + i, compiled.back.input(name)) for i, name in enumerate(compiled.handoff)
        ]
        passed = set(compiled.handoff)
        self._front_inputs = {n for p in compiled.front.inputs for n in p.names}
        self._back_inputs = {n for p in compiled.back.inputs for n in p.names} - passed
        self._front_outputs = {n for p in compiled.front.outputs[:own] for n in p.names}

    @property
    def model_inputs(self) -> list[Any]:
        return self._compiled.inputs

    def set_tensor(self, port: str | Any, tensor: ov.Tensor) -> None:
        name = port if isinstance(port, str) else port.get_any_name()
        taken = False
        if name in self._front_inputs:
            self._front.set_tensor(name, tensor)
            taken = True
        if name in self._back_inputs:
            self._back.set_tensor(name, tensor)
            taken = True
        if not taken:
            raise RuntimeError(f"the halved graph has no input {name!r}")

    def get_tensor(self, name: str) -> ov.Tensor:
        if name in self._front_outputs:
            return self._front.get_tensor(name)
        return self._back.get_tensor(name)

    def query_state(self) -> list[Any]:
        return [*self._front.query_state(), *self._back.query_state()]

    def infer(self) -> None:
        self._front.infer()
        for index, port in self._handoff:  # the front's output tensors may move between calls
            self._back.set_tensor(port, self._front.get_output_tensor(index))
        self._back.infer()


def compile_halves(
    core: ov.Core, halves: GraphHalves, device: str, properties: Mapping[str, Any]
) -> HalvedCompiledModel:
    """Both halves compiled at once: the back on a thread of its own, the front on the
    caller's (OpenVINO releases the GIL while it compiles). Raises the first failure."""
    # The halves share constants and input nodes: safe to compile at once, as the CPU
    # plugin clones a model before it transforms it (plugin.cpp, read) and only reads it.
    with ThreadPoolExecutor(1, thread_name_prefix="ovspec-back-half") as pool:
        back = pool.submit(core.compile_model, halves.back, device, dict(properties))
        front = core.compile_model(halves.front, device, dict(properties))
        return HalvedCompiledModel(front, back.result(), halves.handoff)


def _port(ports: list[Any], name: str) -> Any:
    for port in ports:
        if name in port.names:
            return port
    raise RuntimeError(f"the graph has no port {name!r}")
