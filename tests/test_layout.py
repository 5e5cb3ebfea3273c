"""The package layout as a contract: imports point down the layers, peers stay apart,
no module imports itself back through others, and modules stay small.

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
    frozenset({"compile"}),
    frozenset({"runtime"}),
    frozenset({"bench", "trials"}),  # workflows
    frozenset({"cli"}),
    frozenset({""}),  # the root package: the public facade (ovspec.open, __version__)
)
MAX_MODULE_LINES = 500  # beyond it, a module says why at its top (see below)
LONG_MODULE_REASON = "Longer than"  # the phrase a long module's docstring must carry


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


def test_every_folder_says_what_it_owns() -> None:
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert len(doc.splitlines()) >= 2, f"{init} needs a docstring saying what it owns"
