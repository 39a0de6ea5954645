"""The package's shape, read from its source with `ast`: no import cycle, counting every import statement
(a lazy import inside a function closes a cycle as surely as one at the top), and no long function."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# package → folder, as pyproject.toml installs them
ROOTS = {"clbench": REPO / "clbench", "clbench.tasks": REPO / "tasks", "clbench.baselines": REPO / "baselines"}
LONGEST_FUNCTION = 80  # lines, def to last line
PACKAGE = sorted(path for folder in ROOTS.values() for path in folder.rglob("*.py"))


def modules(roots: dict[str, Path]) -> dict[str, Path]:
    """Module name → file, for every .py file under each root folder (a package's __init__.py is the package)."""
    found = {}
    for package, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            found[".".join((package, *parts[: -1 if parts[-1] == "__init__" else None]))] = path
    return found


def imported(module: str, path: Path, known: set[str]) -> set[str]:
    """The known modules a module's import statements name, wherever they stand in it. Importing a.b.c runs
    a, a.b and a.b.c; `from a.b import c` may name a module a.b.c or a name in a.b."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node, module, is_package=path.name == "__init__.py")
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & known
    return found - {module}


def absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a `from … import` names, relative ones (`from . import x`) resolved against `module`."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(roots: dict[str, Path]) -> dict[str, set[str]]:
    found = modules(roots)
    return {module: imported(module, path, set(found)) for module, path in found.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import path a → … → a per strongly connected component of more than one module (Tarjan's)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while v not in component:
                component.add(stack.pop())
            on_stack.difference_update(component)
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [loop(graph, component) for component in components]


def loop(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(component)
    paths, seen = [[start]], set()
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & component):
            if w == start:
                return path + [start]
            if w not in seen:
                seen.add(w)
                paths.append(path + [w])
    raise AssertionError(f"{sorted(component)} is no cycle")


def long_functions(files: list[Path], limit: int = LONGEST_FUNCTION) -> list[str]:
    """`file:line name (n lines)` for each function or method, nested ones too, longer than `limit` lines."""
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path}:{node.lineno} {node.name} ({lines} lines)")
    return found


# ---------------------------------------------------------------- the package


def test_no_import_cycle_in_the_package():
    graph = import_graph(ROOTS)
    assert {"clbench.cli", "clbench.report.page", "clbench.tasks.xling", "clbench.baselines.et"} <= set(graph)
    assert "clbench.report.paper" in graph["clbench.report.page"]
    assert [" → ".join(path) for path in cycles(graph)] == []


def test_no_module_of_the_library_imports_the_test_kit():
    # clbench.testing builds tiny models and task files for tests: nothing in a run may depend on it
    graph = import_graph(ROOTS)
    assert "clbench.testing" in graph
    assert sorted(module for module, imports in graph.items() if "clbench.testing" in imports) == []


def test_no_function_in_the_package_is_long():
    assert {REPO / "clbench" / "protocol.py", REPO / "clbench" / "report" / "page.py"} <= set(PACKAGE)
    assert long_functions(PACKAGE) == []


# ---------------------------------------------------------------- the checkers, on packages made here


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_a_cycle_closed_by_a_lazy_import_is_found(tmp_path):
    root = write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "a.py": "from pkg import b\n",
            "b.py": "def f():\n    from pkg.c import g\n    return g\n",
            "c.py": "import json\n\ndef g():\n    from . import a\n",
            "d.py": "from pkg.a import x\n",  # into the cycle, not part of it
        },
    )
    graph = import_graph({"pkg": root})
    assert graph["pkg.c"] == {"pkg", "pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_a_package_init_and_its_module_importing_each_other_are_a_cycle(tmp_path):
    files = {"__init__.py": "from .sub.m import x\n", "sub/__init__.py": "", "sub/m.py": "from pkg import y\n"}
    graph = import_graph({"pkg": write(tmp_path / "pkg", files)})
    assert graph == {"pkg": {"pkg.sub", "pkg.sub.m"}, "pkg.sub": set(), "pkg.sub.m": {"pkg"}}
    assert cycles(graph) == [["pkg", "pkg.sub.m", "pkg"]]


def test_an_acyclic_package_has_no_cycle(tmp_path):
    root = write(tmp_path / "pkg", {"__init__.py": "", "a.py": "import pkg.b\n", "b.py": "def f():\n    import os\n"})
    assert cycles(import_graph({"pkg": root})) == []


def test_a_long_function_is_named_with_its_length(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(80))
    path = write(tmp_path, {"m.py": f"def short():\n    pass\n\n\nclass C:\n    def long(self):\n{body}\n"}) / "m.py"
    (tmp_path / "n.py").write_text("def fits():\n" + "\n".join(f"    y{i} = {i}" for i in range(79)) + "\n")
    found = long_functions([path, tmp_path / "n.py"])
    assert [f.split(" ", 1)[1] for f in found] == ["long (81 lines)"]
