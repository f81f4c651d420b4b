"""Print the package's import cycles, its function-level imports and its longest functions and modules.

`python tools/code_shape.py` (from the repo root). Module-level imports only, as Python resolves them; an
import inside a function is listed separately (they hide dependencies from the map). Such an import is
kept only for a reason (an optional heavy dependency, start-up time, a cycle) written as a comment on its
line: the ones without are listed by place.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from dataclasses import dataclass
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


@dataclass(frozen=True)
class NestedImport:
    """An import below the top level of a module (in a function, or a try/if) outside TYPE_CHECKING."""

    path: str
    line: int
    module: str
    of_package: bool  # imports a module of the package (else the standard library or a dependency)
    reason: str | None  # the comment on its line(s)


def imports(path: Path, modules: set[str]) -> tuple[set[str], set[str], list[NestedImport]]:
    """Module-level imports of package modules, function-level ones, and every function-level import."""
    source = path.read_text()
    tree = ast.parse(source)
    comments = _comments(source)
    current, is_pkg = module_name(path), path.name == "__init__.py"
    found: set[str] = set()
    hidden: set[str] = set()
    nested: list[NestedImport] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
            mod = names[0]
        elif isinstance(node, ast.ImportFrom):
            mod = resolve(node, current, is_pkg)
            names = [f"{mod}.{a.name}" for a in node.names] + [mod]
        else:
            continue
        targets = {n for n in (_owner(n, modules) for n in names) if n and n != current}
        if node.col_offset > 0 and not _in_type_checking(tree, node):
            lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            reason = " ".join(comments[n] for n in lines if n in comments) or None
            nested.append(NestedImport(str(path.relative_to(ROOT)), node.lineno, mod, bool(targets), reason))
            hidden |= targets
            continue
        found |= targets
    return found, hidden, nested


def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment on that line."""
    out: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


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


def print_nested(nested: list[NestedImport]) -> None:
    for of_package, what in ((True, "package modules"), (False, "other modules (standard library, dependencies)")):
        rows = [n for n in nested if n.of_package == of_package]
        reasoned = sum(1 for n in rows if n.reason)
        print(f"function-level imports of {what}: {len(rows)} ({reasoned} with a reason comment)")
    missing = sorted((n for n in nested if not n.reason), key=lambda n: (n.path, n.line))
    print(f"function-level imports without a reason comment: {len(missing)}")
    for n in missing:
        print(f"  {n.path}:{n.line} {n.module}")


MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 600


def over_limits(paths: list[Path]) -> list[str]:
    """Functions over MAX_FUNCTION_LINES and modules over MAX_MODULE_LINES (the team's size rule)."""
    out = [f"function of {n} lines: {where}" for n, where in longest_functions(paths, 10_000)
           if n > MAX_FUNCTION_LINES]
    for p in paths:
        n = len(p.read_text().splitlines())
        if n > MAX_MODULE_LINES:
            out.append(f"module of {n} lines: {p.relative_to(ROOT)}")
    return out


def main(check: bool = False) -> int:
    paths = sorted((ROOT / PACKAGE).rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    full: dict[str, set[str]] = {}
    nested: list[NestedImport] = []
    for p in paths:
        top, hidden, found_nested = imports(p, modules)
        graph[module_name(p)], full[module_name(p)] = top, top | hidden
        nested += found_nested
    found = cycles(graph)
    print(f"import cycles (module-level imports): {len(found)}")
    for comp in found:
        print("  " + " <-> ".join(comp))
    found_all = cycles(full)
    print(f"import cycles (function-level imports included): {len(found_all)}")
    for comp in found_all:
        print("  " + " <-> ".join(comp))
    found = found + found_all
    print_nested(nested)
    print("longest functions:")
    for n, where in longest_functions(paths, 8):
        print(f"  {n:4d}  {where}")
    print("longest modules:")
    for n, p in sorted(((len(p.read_text().splitlines()), p) for p in paths), reverse=True)[:8]:
        print(f"  {n:4d}  {p.relative_to(ROOT)}")
    too_long = over_limits(paths) if check else []
    for line in too_long:
        print(f"over the size limit: {line}")
    return 1 if found or too_long else 0


if __name__ == "__main__":
    # --check (CI): also fail on a function over 60 lines or a module over 600
    sys.exit(main(check="--check" in sys.argv[1:]))
