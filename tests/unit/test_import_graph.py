"""The import graph of graphdoctor/ and checks/, read from the source with ast (every `import`, at module level and
inside functions): no cycle; every import runs down the floors (FLOORS: a room imports only rooms on its own floor
or below); nothing outside graphdoctor.child imports it (the parent starts children by module name);
graphdoctor.config imports nothing of graphdoctor's but its leaf modules."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FLOORS: dict[str, int] = {
    "graphdoctor.errors": 1, "graphdoctor.installed": 1, "graphdoctor.suggest": 1, "graphdoctor.strict_json": 1,
    "graphdoctor.types": 1, "graphdoctor.locations": 1, "graphdoctor.process_env": 1, "graphdoctor.collector": 1,
    "graphdoctor.lazy": 1,
    "graphdoctor.inputs": 2, "graphdoctor.envelope": 2, "graphdoctor.cuda_errors": 2,
    "graphdoctor.config": 3, "graphdoctor.memory": 3, "graphdoctor.launches": 3,
    "graphdoctor.rules": 4, "graphdoctor.options": 4, "graphdoctor.protocol": 4,
    "graphdoctor.checks": 5, "graphdoctor.compare": 5,
    "graphdoctor.parent": 6,
    "graphdoctor.probes": 7, "graphdoctor.count": 7, "graphdoctor.diff": 7,
    "graphdoctor.advise": 8, "graphdoctor.child": 8,
    "graphdoctor.report": 9,
    "graphdoctor.cli": 10, "graphdoctor.plugin_session": 10,
    "graphdoctor.__main__": 11, "graphdoctor.pytest_plugin": 11,
}
"""The house's floors, ground first (docs/architecture.md): every room of graphdoctor/ and checks/ and the floor it
stands on. The package's own face, `graphdoctor` (its __init__), is left out: it only hands names on."""

CONFIG_MAY_IMPORT = ("graphdoctor.config", "graphdoctor.errors", "graphdoctor.inputs", "graphdoctor.suggest",
                     "graphdoctor.installed", "graphdoctor.process_env")


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for base in ("graphdoctor", "checks"):
        for path in (REPO / base).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[0] == "checks":
                parts = ["graphdoctor", "checks", *parts[1:]]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the graphdoctor modules it imports (a name imported from a package counts as its module when it
    is one, else as the package)."""
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("graphdoctor"):
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name.startswith("graphdoctor")]
            for name in names:
                target = owner(name)
                if target and target != module and not module.startswith(target + "."):
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
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
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_import_graph_has_no_cycle() -> None:
    assert cycles(import_graph()) == []


def test_a_planted_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_nothing_outside_the_child_package_imports_it() -> None:
    graph = import_graph()
    assert sorted(m for m, targets in graph.items() if not m.startswith("graphdoctor.child")
                  and any(t.startswith("graphdoctor.child") for t in targets)) == []


def test_the_config_package_imports_only_leaf_modules() -> None:
    graph = import_graph()
    outside = {(m, t) for m, targets in graph.items() if m.startswith("graphdoctor.config")
               for t in targets if not t.startswith(CONFIG_MAY_IMPORT)}
    assert outside == set()


def floor(module: str) -> int | None:
    """The floor of the room `module` belongs to (the longest FLOORS prefix), None for the package's face."""
    room = max((r for r in FLOORS if module == r or module.startswith(r + ".")), key=len, default=None)
    return FLOORS[room] if room is not None else None


def test_every_room_has_a_floor() -> None:
    assert sorted(m for m in import_graph() if m != "graphdoctor" and floor(m) is None) == []


def test_every_import_runs_down_the_floors() -> None:
    graph = import_graph()
    upward = sorted((m, t) for m, targets in graph.items() for t in targets
                    if floor(m) is not None and floor(t) is not None and floor(t) > floor(m))  # type: ignore[operator]
    assert upward == [], "imports that run back up a floor (move the module, or the name, down): " + str(upward)
