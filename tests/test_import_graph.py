"""The shape of the package, read from its sources: no import cycle, no lkv import hidden in a
function, no module over 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 400
# Imports that may sit inside a function: optional or heavy third-party packages, loaded when used.
LAZY_OK = {"transformers", "peft", "accelerate", "huggingface_hub", "matplotlib", "datasets", "pyarrow", "kvpress",
           "httpx2", "torch.distributed"}


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported(name: str, path: Path, node: ast.AST, known: dict) -> list[str]:
    """The modules an import statement names (``from . import x`` names ``pkg.x`` when that is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if node.level:
        base = package
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        target = f"{base}.{node.module}" if node.module else base
    else:
        target = node.module or ""
    return [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]


def graph() -> tuple[dict[str, set[str]], list[tuple[str, int, str]]]:
    """(edges between lkvcli modules, imports inside functions as (module, line, imported))."""
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    inner = []
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f) if n is not f}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in imported(name, path, node, known):
                if target in known and target != name:
                    edges[name].add(target)
                if id(node) in nested:
                    inner.append((name, node.lineno, target))
    return edges, inner


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    edges, _ = graph()
    assert len(edges) > 40 and edges["lkvcli.collect"], "the graph was not built from the sources"
    assert cycles(edges) == []


def test_imports_inside_functions_are_only_heavy_optional_packages():
    _, inner = graph()
    # lkvcli/__init__.py imports the API lazily (PEP 562), so `import lkvcli` stays light
    bad = [(m, line, t) for m, line, t in inner
           if not (m == "lkvcli" and t == "lkvcli.api") and not any(t == p or t.startswith(p + ".") for p in LAZY_OK)]
    assert bad == []


def test_no_module_over_400_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
