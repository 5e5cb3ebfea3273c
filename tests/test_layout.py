"""The package layout as a contract: imports point down the layers, peers stay apart,
no module imports itself back through others, modules and functions stay small, and
only the device profiles decide by a device's name.

Every ``import``/``from ... import`` of an ovspec module counts, at module level or
inside a function or a ``TYPE_CHECKING`` block: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ovspec"

# Lower layers first. A module may import its own layer's other modules (inside its
# own folder) and anything in a lower layer; folders listed together in one layer are
# peers and may not import each other.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "version"}),  # primitives
    frozenset({"ladder", "extras"}),  # the ladder; the optional extras' check
    frozenset({"stats", "builtin", "testing"}),  # statistics; builtin: models; test helpers
    frozenset({"ir", "store"}),  # the model side; the blob store
    frozenset({"compile"}),  # with the device profiles at its bottom (compile/devices)
    frozenset({"runtime"}),
    frozenset({"bench", "trials", "serve"}),  # workflows
    frozenset({"cli"}),
    frozenset({""}),  # the root package: the public facade (ovspec.open, __version__)
)
# The one place that may decide by a device's name (everything else asks a profile).
DEVICE_PROFILES = "ovspec.compile.devices"
DEVICE_NAMES = frozenset({"CPU", "GPU", "NPU"})  # in any case: "cpu" names CPU too
VIRTUAL_DEVICES = frozenset({"AUTO", "HETERO", "MULTI", "BATCH"})  # as spelled ("auto" is a word)
TOOLS = PACKAGE.parent / "tools"
MAX_MODULE_LINES = 500  # beyond it, a module says why at its top (see below)
LONG_MODULE_REASON = "Longer than"  # the phrase a long module's docstring must carry
MAX_FUNCTION_LINES = 100  # def line to last line, decorators excluded


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def unit(module: str) -> str:
    """The layer unit of a module: its first folder under ovspec, or its own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(module: str) -> int:
    for rank, units in enumerate(LAYERS):
        if unit(module) in units:
            return rank
    raise AssertionError(f"{module} is in no layer; add its folder to LAYERS")


def resolve(target: str, name: str | None) -> str:
    """``from target import name``: the submodule if ``name`` is one, else ``target``."""
    if name is not None and f"{target}.{name}" in MODULES:
        return f"{target}.{name}"
    return target


def type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                inside.update(id(n) for n in ast.walk(stmt))
    return inside


def imports(path: Path, runtime_only: bool = False) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = type_checking_nodes(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "ovspec" or node.module.startswith("ovspec."):
                for alias in node.names:
                    yield resolve(node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "ovspec" or alias.name.startswith("ovspec."):
                    yield alias.name


GRAPH = {module: sorted(set(imports(path)) - {module}) for module, path in MODULES.items()}
RUNTIME_GRAPH = {
    module: sorted(set(imports(path, runtime_only=True)) - {module})
    for module, path in MODULES.items()
}


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_imports_point_down_and_peers_stay_apart() -> None:
    wrong = []
    for module, targets in GRAPH.items():
        for target in targets:
            if target not in MODULES:
                wrong.append(f"{module} imports {target}, which does not exist")
                continue
            same_unit = unit(module) == unit(target)
            if not same_unit and layer_of(target) >= layer_of(module):
                wrong.append(f"{module} imports {target} ({unit(target) or 'root'} is not below)")
    assert wrong == []


def test_no_import_cycles() -> None:
    # Imports that run count, lazy ones included. Type-only imports (TYPE_CHECKING) do
    # not: a helper module may name the class that calls it (store.maintenance names
    # Store). A package __init__ that lazily re-exports a submodule (ovspec.store ->
    # .local) is a facade, not a dependency of the submodule; drop those edges.
    graph = {
        module: [t for t in targets if not t.startswith(module + ".")]
        for module, targets in RUNTIME_GRAPH.items()
    }
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError naming the cycle


def test_the_checker_sees_a_cycle_and_an_upward_import() -> None:
    # The two checks above must be able to fail.
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter({"a": ["b"], "b": ["a"]}).prepare()
    assert layer_of("ovspec.runtime.loader") < layer_of("ovspec.bench.protocols.runner")
    assert layer_of("ovspec.store.local") == layer_of("ovspec.ir.roles")


def test_modules_stay_small_or_say_why() -> None:
    long = []
    for module, path in MODULES.items():
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        if module.startswith("ovspec.cli.") or lines <= MAX_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if LONG_MODULE_REASON not in doc:
            long.append(f"{module}: {lines} lines and no reason at its top")
    assert long == []


def long_functions(source: str, name: str) -> list[str]:
    """Every function in ``source`` longer than MAX_FUNCTION_LINES, as ``name:def``."""
    return [
        f"{name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_functions_stay_under_a_hundred_lines() -> None:
    long = [
        found
        for module, path in MODULES.items()
        for found in long_functions(path.read_text(encoding="utf-8"), module)
    ]
    assert long == []


def test_the_function_check_counts_a_long_body() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def big():\n{body}", "m") == ["m:big (101 lines)"]
    assert long_functions(f"def fits():\n{body[: body.rindex('    x')]}", "m") == []


def test_every_folder_says_what_it_owns() -> None:
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert len(doc.splitlines()) >= 2, f"{init} needs a docstring saying what it owns"


def test_device_profiles_sit_below_the_rest_of_compile() -> None:
    # The compiler, the worker and the build workflow ask the profiles: a profile that
    # imported them back would make a circle. Only the modes enum is shared.
    allowed = ("ovspec.compile.modes", DEVICE_PROFILES)
    wrong = [
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if module.startswith(DEVICE_PROFILES)
        for target in targets
        if unit(target) == "compile" and not target.startswith(allowed)
    ]
    assert wrong == []


def _names_a_device(node: ast.AST) -> bool:
    """A text constant naming a device (any case, ``NPU.0`` too), or a tuple, list or set
    holding one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        family = node.value.split(".", 1)[0].split(":", 1)[0]
        return family.upper() in DEVICE_NAMES or family in VIRTUAL_DEVICES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_device(e) for e in node.elts)
    return False


def _calls_device_family(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    return name == "device_family"


def device_decisions(source: str) -> list[int]:
    """Lines that decide by a device's name: a comparison (``==``, ``in``, ...) with a
    device name, ``.startswith``/``.endswith`` of one, a ``case`` on one, a table keyed
    by one, or any use of ``device_family``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            hit = any(_names_a_device(o) for o in (node.left, *node.comparators))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            hit = node.func.attr in ("startswith", "endswith") and any(
                _names_a_device(a) for a in node.args
            )
        elif isinstance(node, ast.MatchValue):
            hit = _names_a_device(node.value)
        elif isinstance(node, ast.Dict):
            hit = any(isinstance(k, ast.Constant) and k.value in DEVICE_NAMES for k in node.keys)
        else:
            hit = False
        if hit or _calls_device_family(node):
            lines.append(getattr(node, "lineno", 0))
    return sorted(set(lines))


def test_only_device_profiles_decide_by_device_name() -> None:
    outside = {m: p for m, p in MODULES.items() if not m.startswith(DEVICE_PROFILES)}
    outside.update({f"tools.{p.stem}": p for p in sorted(TOOLS.glob("*.py"))})
    found = [
        f"{module}:{line}"
        for module, path in outside.items()
        for line in device_decisions(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "ask the device profile (ovspec/compile/devices/) instead"


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ('if device == "CPU": pass', 1),
        ('if device.upper() != "npu": pass', 1),
        ('ok = "NPU" in core.available_devices', 1),
        ('ok = family in ("GPU", "CPU")', 1),
        ('ok = device.startswith("NPU")', 1),
        ('ok = device == "HETERO:NPU,CPU"', 1),
        ("ok = device_family(device) == family", 1),
        ('table = {"CPU": 1}', 1),
        ('match device:\n    case "CPU.0":\n        pass', 2),
    ],
)
def test_the_device_check_sees_each_way_of_deciding_by_name(source: str, line: int) -> None:
    assert device_decisions(source) == [line]


def test_the_device_check_leaves_plain_mentions_alone() -> None:
    source = (
        'open(model, device="CPU")\nreport = {"cpu": model_name}\nhelp = "--device NPU"\n'
        'mode = None if value == "auto" else value\n'
    )
    assert device_decisions(source) == []
