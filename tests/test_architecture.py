"""The house rules, read from the source: imports run one way, no import cycles, short modules
and functions (README "Where things are"; ../shared/DESIGN.md "The pipeline")."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> the package it is installed as (pyproject.toml's package-dir)
PACKAGES = {
    "caffe2jax": "caffe2jax",
    "frontend": "caffe2jax.frontend",
    "lowering": "caffe2jax.lowering",
    "runtime": "caffe2jax.runtime",
}
GENERATED = {"caffe2jax.frontend.caffe_pb2"}
# The registry imports every family on first lookup, and each family imports the registry:
# the one designed cycle (lowering/registry.py _load_families).
DESIGNED = {
    ("caffe2jax.lowering.registry", "caffe2jax.lowering.families"),
    # the ONNX converters' registry, the same way (runtime/onnx/registry.py)
    ("caffe2jax.runtime.onnx.registry", "caffe2jax.runtime.onnx.families"),
}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50


@cache
def modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _owner(name: str) -> str:
    """The module of ours that an imported dotted name lives in."""
    mods = modules()
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> set[str]:
    """Every caffe2jax module ``tree`` imports, at the top or lazily inside functions, except
    under ``if TYPE_CHECKING:`` (which never runs)."""
    found: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(_owner(a.name) for a in node.names if a.name.startswith("caffe2jax"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("caffe2jax"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in modules() else _owner(node.module))
        stack.extend(ast.iter_child_nodes(node))
    return found - {""}


@cache
def graph() -> dict[str, set[str]]:
    edges = {}
    for name, path in modules().items():
        if name not in GENERATED:
            edges[name] = _imports(ast.parse(path.read_text())) - {name}
    return edges


def _violations(sources: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()):
    return sorted(
        f"{src} imports {dst}"
        for src, dsts in graph().items()
        if src == sources or src.startswith(sources + ".")
        for dst in dsts
        if dst.startswith(forbidden) and not dst.startswith(allowed)
    )


def test_frontend_imports_nothing_of_the_rest():
    rest = ("caffe2jax.lowering", "caffe2jax.runtime", "caffe2jax.pycaffe", "caffe2jax.cli")
    assert _violations("caffe2jax.frontend", rest) == []
    assert "caffe2jax" not in set().union(*(graph()[m] for m in graph() if ".frontend" in m))


def test_engines_import_nothing_of_lowerings_families_graph_or_registry():
    bad = _violations(
        "caffe2jax.lowering.engines", ("caffe2jax.lowering.",), ("caffe2jax.lowering.engines",)
    )
    assert bad == []


def test_lowering_imports_nothing_of_runtime_or_the_facade():
    facade = ("caffe2jax.runtime", "caffe2jax.pycaffe", "caffe2jax.cli")
    assert _violations("caffe2jax.lowering", facade) == []
    assert [
        m for m, d in graph().items() if m.startswith("caffe2jax.lowering") and "caffe2jax" in d
    ] == []


def test_runtime_imports_nothing_of_pycaffe_the_cli_or_the_api():
    facade = ("caffe2jax.pycaffe", "caffe2jax.cli", "caffe2jax.api")
    assert _violations("caffe2jax.runtime", facade) == []
    assert [
        m for m, d in graph().items() if m.startswith("caffe2jax.runtime") and "caffe2jax" in d
    ] == []


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), designed edges cut."""
    edges = {
        m: {d for d in ds if (m, d) not in DESIGNED and d in graph()} for m, ds in graph().items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_lazy_ones_included():
    assert _cycles() == []


def test_the_designed_cycle_is_the_registrys_family_import():
    # the cut edge exists, so the test above really checks the rest of the lowering package
    assert "caffe2jax.lowering.families" in graph()["caffe2jax.lowering.registry"]


def test_the_import_reader_sees_lazy_imports_and_skips_type_checking():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from caffe2jax.runtime.train import loop\n"
        "def f():\n    from caffe2jax.lowering import graph\n"
    )
    assert _imports(tree) == {"caffe2jax.lowering.graph"}


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    first = body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(
        getattr(first, "value", None), ast.Constant
    )
    start = (body[1].lineno if len(body) > 1 else first.end_lineno) if docstring else first.lineno
    return node.end_lineno - start + 1


def test_no_module_over_400_lines():
    long = {
        name: n
        for name, path in modules().items()
        if name not in GENERATED and (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_function_body_over_50_lines():
    long = []
    for name, path in modules().items():
        if name in GENERATED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := _body_lines(node)) > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name} (line {node.lineno}): {n}")
    assert long == []
