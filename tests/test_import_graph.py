"""The import graph of src/, drawn from the sources: no circles, and layers import downward only.

Every `import` / `from ... import` statement counts, wherever it sits: at module level, inside a function
(a lazy import) or under `if TYPE_CHECKING:`. A circle of lazy or type-only imports still ties two files into
one unit that can only be read, tested and changed together, so it is a circle all the same.

Run as a script (`python tests/test_import_graph.py`) to print the graph's circles and each module's imports.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: Layers, top to bottom: a package may import only packages below it (and itself).
LAYERS = {"aitune": 2, "aitune_jit": 1, "aitune_aot": 1, "aitune_core": 0}


def module_files(src: Path = SRC) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file under `src`."""
    modules = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imported_names(module: str, path: Path) -> Iterable[str]:
    """Every dotted name an import statement in `path` names (`from a import b` names `a.b` and `a`)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the project modules it imports (an imported name maps to the longest module it names)."""
    modules = module_files(src)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in _imported_names(module, path):
            if name in modules:
                targets.add(name)
        # `from a import b` where b is a function names `a.b` (not a module) and `a` (the module): keep `a`;
        # where b is a submodule, `a.b` is the import and `a` only its package: drop the package
        targets = {t for t in targets if not any(o.startswith(t + ".") for o in targets)}
        graph[module] = targets - {module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_the_circle_finder_finds_a_circle_and_only_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_type_checking_and_lazy_imports_are_edges(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "data.py").write_text("def draw():\n    from pkg.draw import render\n    return render\n")
    (package / "draw.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .data import draw\n"
    )
    graph = import_graph(tmp_path)
    assert graph["pkg.data"] == {"pkg.draw"} and graph["pkg.draw"] == {"pkg.data"}
    assert circles(graph) == [{"pkg.data", "pkg.draw"}]


def test_no_import_circles_in_src():
    found = [sorted(c) for c in circles(import_graph())]
    assert not found, f"import circles: {found}"


def test_layers_import_downward_only():
    def allowed(module: str, target: str) -> bool:
        source, dest = module.split(".")[0], target.split(".")[0]
        return source == dest or LAYERS[dest] < LAYERS[source]

    upward = [(m, t) for m, targets in import_graph().items() for t in targets if not allowed(m, t)]
    assert not upward, f"imports that climb or cross a layer: {upward}"


if __name__ == "__main__":
    drawn = import_graph(Path(sys.argv[1]) if len(sys.argv) > 1 else SRC)
    for component in circles(drawn):
        print("circle:", " <-> ".join(sorted(component)))
    for name, imports in sorted(drawn.items()):
        print(f"{name}: {', '.join(sorted(imports)) or '-'}")
