"""The house rules, read from the source: imports run one way, no import cycles, short modules
and functions (README "Where things are"; ../shared/DESIGN.md "The pipeline")."""

from __future__ import annotations

import ast
import re
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
DESIGNED = {("caffe2jax.lowering.registry", "caffe2jax.lowering.families")}
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


# -- the runtime's rooms, the facades and scripts/ (issue 33) ---------------------------------

MAX_LOOSE_RUNTIME_MODULES = 2
MAX_PRIVATE_REACHES = 15
FACADE = ("caffe2jax.pycaffe", "caffe2jax.cli", "caffe2jax.logs", "caffe2jax.proto")
HOST_CODE = ("caffe2jax", "runtime", "examples", "scripts")


def test_runtime_keeps_at_most_two_loose_modules():
    loose = sorted(p.name for p in (ROOT / "runtime").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= MAX_LOOSE_RUNTIME_MODULES, loose


def _imports_scripts(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "scripts"
                                                for a in node.names):  # fmt: skip
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "scripts":
            return True
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "").startswith("spec_from"):
            if "scripts" in ast.unparse(node):
                return True
    return False


def test_tests_and_benchmarks_import_nothing_from_scripts():
    """scripts/ holds developer tools only: what tests or benchmarks need lives in the library,
    examples/ or tests/ (running a developer tool as a program is fine)."""
    found = [
        str(p.relative_to(ROOT))
        for folder in ("tests", "benchmarks")
        for p in (ROOT / folder).rglob("*.py")
        if _imports_scripts(ast.parse(p.read_text()))
    ]
    assert found == []


def _private_reaches(text: str, where: str) -> list[str]:
    """``x._name`` where x is not self/cls (dunders aside), and ``from caffe2jax… import
    _name``: reaches into another object's or module's private members."""
    hits = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            base = node.value
            if node.attr.startswith("__") or (isinstance(base, ast.Name)
                                              and base.id in ("self", "cls")):  # fmt: skip
                continue
            hits.append(f"{where}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("caffe2jax"):
            hits += [f"{where}:{node.lineno} import {a.name}" for a in node.names
                     if a.name.startswith("_") and not a.name.startswith("__")]  # fmt: skip
    return hits


def test_library_code_reaches_into_few_private_members():
    reaches = [
        hit
        for name, path in modules().items()
        if name not in GENERATED
        for hit in _private_reaches(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert len(reaches) <= MAX_PRIVATE_REACHES, "\n".join(reaches)


def test_the_reach_counter_sees_attributes_and_imports():
    text = "from caffe2jax.x import _y\nself._a\ncls._b\nother._c\nx.__len__\n"
    assert sorted(_private_reaches(text, "m")) == ["m:1 import _y", "m:4 ._c"]


def _calls(node: ast.AST, names: tuple[str, ...]) -> bool:
    func = getattr(node, "func", None)
    return isinstance(node, ast.Call) and (getattr(func, "attr", None) in names
                                           or getattr(func, "id", None) in names)  # fmt: skip


def _writes_iou(tree: ast.AST) -> bool:
    """Whether a module computes box overlap: a coordinate intersection (``min(…) − max(…)``)
    and a union (``a + b − inter…``, or something divided by a ``union``). A segmentation
    IoU from a confusion matrix has no coordinates, and is not box overlap."""
    union = corners = False
    for node in ast.walk(tree):
        if not isinstance(node, ast.BinOp):
            continue
        if isinstance(node.op, ast.Sub):
            corners |= _calls(node.left, ("min", "minimum")) and _calls(
                node.right, ("max", "maximum"))  # fmt: skip
            union |= (isinstance(node.left, ast.BinOp) and isinstance(node.left.op, ast.Add)
                      and "inter" in ast.unparse(node.right))  # fmt: skip
        union |= isinstance(node.op, ast.Div) and "union" in ast.unparse(node.right)
    return union and corners


def test_iou_is_written_in_one_host_module():
    """Box overlap on the host is runtime/outputs/boxes.py's (the graph's is lowering's)."""
    writers = sorted(str(p.relative_to(ROOT)) for folder in HOST_CODE
                     for p in (ROOT / folder).rglob("*.py")
                     if _writes_iou(ast.parse(p.read_text())))  # fmt: skip
    assert writers == ["runtime/outputs/boxes.py"]


def test_the_iou_finder_sees_the_usual_forms():
    width = "w = np.maximum(0.0, np.minimum(x2[i], x2[o]) - np.maximum(x1[i], x1[o]) + 1)\n"
    forms = ["r = inter / (areas[i] + areas[order] - inter)", "u = a + b - inter\nr = x / u",
             "union = area(a) + area(b) - size\nr = size / union"]  # fmt: skip
    assert [_writes_iou(ast.parse(width + f)) for f in forms] == [True, True, True]
    assert not _writes_iou(ast.parse(width + "coverage = inter / area(box)"))
    miou = "inter = np.diag(c)\nunion = c.sum(0) + c.sum(1) - inter\nm = inter / union"
    assert not _writes_iou(ast.parse(miou))


def test_runtime_imports_no_facade_module():
    assert _violations("caffe2jax.runtime", FACADE) == []


def test_pycaffe_never_imports_the_cli():
    """The facades stand side by side: the CLI may use pycaffe, never the other way."""
    assert _violations("caffe2jax.pycaffe", ("caffe2jax.cli",)) == []


def test_every_package_is_in_the_wheel():
    """pyproject.toml's explicit ``packages`` list names every package of the four folders."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^packages = \[(.*?)\]", text, re.S | re.M)
    listed = set(re.findall(r'"([\w.]+)"', block.group(1)))
    found = {".".join([PACKAGES[folder], *p.parent.relative_to(ROOT / folder).parts])
             for folder in PACKAGES for p in (ROOT / folder).rglob("__init__.py")}  # fmt: skip
    assert found - listed == set()
