"""The package's imports form no cycle: every module can be read, and loaded, after the ones it uses.

The graph is read from the source with `ast` (nothing is imported). It holds every import that can run:
at module level, and inside functions. A function-local import defers a dependency to call time, which
keeps the interpreter from tripping over a cycle but not a reader: two modules that need each other are
one module split in two (model_merger.py and workers/checkpoint.py were such a pair). Imports under
`if TYPE_CHECKING:` are kept apart, since they never run, but they count for cycles too: a module that
names another's class in its annotations depends on it as a reader does.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "hybridrl"


def module_files(root: Path = REPO / PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its `__init__.py`)."""
    files = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    return files


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it sits under `if TYPE_CHECKING:`."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, guarded))
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, guarded)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(tree, False)
    return found


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom,
                   modules: set[str]) -> set[str]:
    """The package modules whose code runs (or is looked up) when `module` executes `node`.

    Importing `a.b.c` runs `a/b/__init__.py` before `a/b/c.py`, so the packages on the way count too,
    except the importer's own ancestors: Python loads those before the importer itself.
    """
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            anchor = module.split(".") if is_package else module.split(".")[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        # `from pkg import name` reaches the submodule pkg.name when one exists, else pkg itself
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    own = set(_ancestors(module))
    targets = set()
    for name in names:
        for candidate in [*_ancestors(name), name]:
            if candidate in modules and candidate not in own and candidate != module:
                targets.add(candidate)
    return targets


def import_graph(files: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(runtime edges, TYPE_CHECKING-only edges) between the package's modules."""
    runtime: dict[str, set[str]] = {name: set() for name in files}
    typing_only: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, guarded in _imports(tree):
            targets = import_targets(name, path.name == "__init__.py", node, set(files))
            (typing_only if guarded else runtime)[name] |= targets
    return runtime, typing_only


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return cycles


def test_graph_reader_sees_the_known_edges():
    # edges checked by hand in the source
    runtime, _ = import_graph(module_files())
    assert "hybridrl.protocol" in runtime["hybridrl.controller.decorator"]
    # importing a submodule runs its package's __init__ first, except the importer's own packages
    assert "hybridrl.workers.rollout" in runtime["hybridrl.workers.fsdp_workers"]
    assert "hybridrl.workers.rollout" not in runtime["hybridrl.workers.rollout.hf"]
    # `from hybridrl.utils import metric as core` reaches the submodule, not only the package
    tree = ast.parse("from hybridrl.utils import metric as core\n")
    assert import_targets("hybridrl.x", False, tree.body[0], set(module_files())) == {
        "hybridrl.utils", "hybridrl.utils.metric"}
    # a function-local import counts: create_worker_group imports the Ray backend when asked for it
    assert "hybridrl.controller.ray" in runtime["hybridrl.controller"]
    # an import under `if TYPE_CHECKING:` is kept apart (the package has none at the moment)
    tree = ast.parse("if TYPE_CHECKING:\n    import a\nelse:\n    import b\nimport c\n")
    assert [(node.names[0].name, guarded) for node, guarded in _imports(tree)] == [
        ("a", True), ("b", False), ("c", False)]


def test_find_cycles_on_a_small_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert find_cycles(graph) == [["a", "b", "c"]]


def test_package_has_no_import_cycle_annotations_included():
    runtime, typing_only = import_graph(module_files())
    assert find_cycles({name: runtime[name] | typing_only[name] for name in runtime}) == []


# docs/architecture.md, "Layers": a subpackage (or top-level module) imports only from its own layer or below
LAYERS = {
    "utils": 0, "": 0,
    "protocol": 1, "tensor_batch": 1,
    "models": 1,
    "algos": 2, "data": 2, "rewards": 2, "tools": 2,
    "controller": 3,
    "workers": 4,
    "trainer": 5,
    "model_merger": 6, "quickstart": 6,
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_imports_go_down_the_layers():
    runtime, _ = import_graph(module_files())
    assert {layer_of(m) for m in runtime} <= set(LAYERS), "a new subpackage needs a place in LAYERS"
    upward = sorted(f"{a} -> {b}" for a, targets in runtime.items() for b in targets
                    if LAYERS[layer_of(b)] > LAYERS[layer_of(a)])
    assert upward == []


# compat/: verl's call conventions over the core; its modules import hybridrl, and no hybridrl module imports
# one of them (by their module names, as compat/verl_shim.py and the tests load them) or compat itself
COMPAT_MODULES = {path.stem for path in (REPO / "compat").glob("*.py")} | {"compat"}


def test_the_core_never_imports_compat():
    imported = set()
    for path in module_files().values():
        for node, _ in _imports(ast.parse(path.read_text(), filename=str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.Import) or not node.level:
                imported |= {(path.name, name.split(".")[0]) for name in names}
    assert "verl_protocol" in COMPAT_MODULES  # the folder was found
    assert sorted(pair for pair in imported if pair[1] in COMPAT_MODULES) == []
