"""House rules for the code in ``app/``, read from the source alone (nothing is imported).

- no import cycles: a module never reaches itself through the imports that run when it loads
  (module level, including those inside ``if``/``try`` and class bodies). Imports inside a
  function run later, on the first call, and cannot break a load; the cycles they close are
  reported as their own category (and fail too: the two modules still lean on each other).
  Imports under ``if TYPE_CHECKING:`` never run; a cycle they close is a third category, failed
  as well, since the annotations then name a module that imports this one.
- no file over ``MAX_LINES`` lines (Python and C): a file a reader can hold in mind at once.

Run as a script for the report: ``python tests/test_house.py``.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
MAX_LINES = 400


# --- imports ------------------------------------------------------------------------------

def _modules(root: Path = APP) -> dict[str, Path]:
    """Dotted module name -> its file, for every .py under ``root`` (a package is its __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module):
    """(import node, category) for every import statement: "module" (runs when the module
    loads), "function" (inside a function body) or "typing" (under ``if TYPE_CHECKING:``)."""
    def walk(node, category):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, category
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, "function" if category == "module" else category)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), "typing")
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), category)
            else:
                yield from walk(child, category)
    yield from walk(tree, "module")


def _targets(node, name: str, is_package: bool, modules: dict) -> set[str]:
    """The modules of ``app`` that one import statement in module ``name`` loads."""
    found = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            found.add(alias.name)
    else:
        if node.level:
            package = name.split(".") if is_package else name.split(".")[:-1]
            base = ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))
        else:
            base = node.module
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            found.add(sub if sub in modules else base)   # ``from pkg import submodule`` or a name of pkg
    return {m for m in found if m in modules}


def import_graph(root: Path = APP) -> dict[str, dict[str, set[str]]]:
    """{category: {module: the app modules it imports}} for the categories of ``_imports``."""
    modules = _modules(root)
    graph = {"module": {}, "function": {}, "typing": {}}
    for name, path in modules.items():
        for g in graph.values():
            g.setdefault(name, set())
        tree = ast.parse(path.read_text(), str(path))
        for node, category in _imports(tree):
            graph[category][name] |= _targets(node, name, path.name == "__init__.py", modules) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (each one cycle or more),
    sorted: a module in one imports itself back through the others."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):                                      # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def report(root: Path = APP) -> dict[str, list[list[str]]]:
    """{"module": cycles of load-time imports, "function": cycles closed only by an import
    inside a function, "typing": cycles closed only by a TYPE_CHECKING import}."""
    g = import_graph(root)
    load = cycles(g["module"])
    merged = lambda *cats: {m: set().union(*(g[c][m] for c in cats)) for m in g["module"]}   # noqa: E731
    with_calls = [c for c in cycles(merged("module", "function")) if c not in load]
    with_types = [c for c in cycles(merged("module", "typing")) if c not in load]
    return {"module": load, "function": with_calls, "typing": with_types}


def test_no_import_cycles():
    found = report()
    assert not found["module"], f"import cycles among modules of app/ (at load time): {found['module']}"
    assert not found["typing"], f"import cycles closed by TYPE_CHECKING imports: {found['typing']}"
    # an import inside a function breaks no load, but the two modules still lean on each other:
    # the shared code belongs in one of them, or in a module of its own
    assert not found["function"], f"import cycles closed by imports inside functions: {found['function']}"


def test_the_cycle_finder_sees_a_cycle(tmp_path):
    """The finder itself: a load-time cycle, one closed inside a function, a package-relative one."""
    pkg = tmp_path / "app"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import a\n")
    (pkg / "sub" / "a.py").write_text("from app.sub.b import thing\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nfrom .c import x\nthing = 1\n"
                                      "if TYPE_CHECKING:\n    from app.sub.d import y\n")
    (pkg / "sub" / "c.py").write_text("import app.sub.a\nx = 1\n")
    (pkg / "sub" / "d.py").write_text("def f():\n    from app.sub import e\n")
    (pkg / "sub" / "e.py").write_text("from app.sub.d import f\n")
    found = report(pkg)
    assert found["module"] == [["app.sub.a", "app.sub.b", "app.sub.c"]]
    assert found["function"] == [["app.sub.d", "app.sub.e"]]
    assert found["typing"] == []


# --- sizes --------------------------------------------------------------------------------

def long_files(root: Path = APP, limit: int = MAX_LINES) -> dict[str, int]:
    """{path: lines} of the .py, .c and .h files under ``root`` longer than ``limit`` lines."""
    out = {}
    for path in sorted(p for ext in ("py", "c", "h") for p in root.rglob(f"*.{ext}")):
        n = len(path.read_text().splitlines())
        if n > limit:
            out[str(path.relative_to(root.parent))] = n
    return out


def test_no_file_over_400_lines():
    assert not long_files(), f"files in app/ over {MAX_LINES} lines (split them by responsibility): {long_files()}"


if __name__ == "__main__":
    for category, found in report().items():
        print(f"{category}-level import cycles: {found or 'none'}")
    print(f"files over {MAX_LINES} lines: {long_files() or 'none'}")
