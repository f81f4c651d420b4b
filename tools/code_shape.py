"""Print the package's import cycles and its longest functions and modules.

`python tools/code_shape.py` (from the repo root). Module-level imports only, as Python resolves them; an
import inside a function is listed separately (they hide dependencies from the map).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "orchestrator"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def resolve(node: ast.ImportFrom, current: str, is_pkg: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".")
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(path: Path, modules: set[str]) -> tuple[set[str], set[str], int]:
    """Module-level imports of package modules, function-level ones, and the count of the latter."""
    tree = ast.parse(path.read_text())
    current, is_pkg = module_name(path), path.name == "__init__.py"
    found: set[str] = set()
    hidden: set[str] = set()
    nested = 0
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = resolve(node, current, is_pkg)
            names = [f"{mod}.{a.name}" for a in node.names] + [mod]
        else:
            continue
        targets = {n for n in (_owner(n, modules) for n in names) if n and n != current}
        if not targets:
            continue
        if node.col_offset > 0 and not _in_type_checking(tree, node):
            nested += 1
            hidden |= targets
            continue
        found |= targets
    return found, hidden, nested


def _owner(name: str, modules: set[str]) -> str | None:
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _in_type_checking(tree: ast.Module, target: ast.stmt) -> bool:
    for node in tree.body:
        is_guard = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        if is_guard and any(child is target for child in ast.walk(node)):
            return True
    return False


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def longest_functions(paths: list[Path], top: int) -> list[tuple[int, str]]:
    rows = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                rows.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"))
    return sorted(rows, reverse=True)[:top]


def main() -> int:
    paths = sorted((ROOT / PACKAGE).rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    full: dict[str, set[str]] = {}
    nested_total = 0
    for p in paths:
        top, hidden, nested = imports(p, modules)
        graph[module_name(p)], full[module_name(p)] = top, top | hidden
        nested_total += nested
    found = cycles(graph)
    print(f"import cycles (module-level imports): {len(found)}")
    for comp in found:
        print("  " + " <-> ".join(comp))
    found_all = cycles(full)
    print(f"import cycles (function-level imports included): {len(found_all)}")
    for comp in found_all:
        print("  " + " <-> ".join(comp))
    found = found + found_all
    print(f"function-level imports of package modules: {nested_total}")
    print("longest functions:")
    for n, where in longest_functions(paths, 8):
        print(f"  {n:4d}  {where}")
    print("longest modules:")
    for n, p in sorted(((len(p.read_text().splitlines()), p) for p in paths), reverse=True)[:8]:
        print(f"  {n:4d}  {p.relative_to(ROOT)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
