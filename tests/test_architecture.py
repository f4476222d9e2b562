"""The house rules, read from the source: imports run one way, no import cycles, short modules
and functions, and the rooms of lowering/ (machinery at the top, BVLC's families in layers/, the
forks' in forks/, box maths once in boxes/) (README "Layout"; ../shared/DESIGN.md "The
pipeline")."""

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
# the one designed cycle (lowering/registry.py load_families).
DESIGNED = {
    ("caffe2jax.lowering.registry", "caffe2jax.lowering.layers"),
    ("caffe2jax.lowering.registry", "caffe2jax.lowering.forks"),
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
    # the cut edges exist, so the test above really checks the rest of the lowering package
    for module, dependency in DESIGNED:
        assert dependency in graph()[module], (module, dependency)


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


# -- the rooms of lowering/ ---------------------------------------------------------------------

MAX_LOWERING_TOP = 15
LOWERING = ROOT / "lowering"
# BVLC Caffe's layer types (src/caffe/layers/ at BVLC master): every other registered type is a
# fork's (or caffe2jax's stand-in for a fork's Python layer, RoIData)
BVLC_TYPES = frozenset(
    "AbsVal Accuracy ArgMax BatchNorm BatchReindex Bias BNLL Clip Concat ContrastiveLoss "
    "Convolution Crop Data Deconvolution Dropout DummyData Eltwise ELU Embed EuclideanLoss Exp "
    "Filter Flatten HDF5Data HDF5Output HingeLoss Im2col ImageData InfogainLoss InnerProduct "
    "Input Log LRN LSTM LSTMUnit MemoryData MultinomialLogisticLoss MVN Parameter Pooling Power "
    "PReLU Python Reduction ReLU Reshape RNN Scale Sigmoid SigmoidCrossEntropyLoss Silence Slice "
    "Softmax SoftmaxWithLoss Split SPP Swish TanH Threshold Tile WindowData".split()
)


def _registered_by_folder() -> dict[str, dict[str, set]]:
    """Per folder of lowering/ (package name): the BVLC types and the fork types or forms its
    modules register (a fork entry: a fork form, a type of a fork, or a built-in Python layer)."""
    from caffe2jax.lowering.python_layer import builtin_python_layers
    from caffe2jax.lowering.registry import lowering_of, registered_forms

    found: dict[str, dict[str, set]] = {}
    for type_name, form in registered_forms():
        module = lowering_of(type_name, form).fn.__module__
        kind = "bvlc" if not form and type_name in BVLC_TYPES else "fork"
        found.setdefault(module.rpartition(".")[0], {"bvlc": set(), "fork": set()})[kind].add(
            (type_name, form, module)
        )
    for key, fn in builtin_python_layers():
        if not isinstance(fn, str):  # the data layer types are registered above
            folder = found.setdefault(
                fn.__module__.rpartition(".")[0], {"bvlc": set(), "fork": set()}
            )
            folder["fork"].add(("Python", key, fn.__module__))
    return found


def test_no_folder_of_lowering_registers_both_bvlc_and_fork_types():
    mixed = {
        folder: sorted(kinds["fork"])[:3]
        for folder, kinds in _registered_by_folder().items()
        if kinds["bvlc"] and kinds["fork"]
    }
    assert mixed == {}
    folders = _registered_by_folder()
    assert {t for t, _, _ in folders["caffe2jax.lowering.layers"]["bvlc"]} == BVLC_TYPES
    assert not folders["caffe2jax.lowering.forks"]["bvlc"]


def test_lowerings_top_holds_machinery_only():
    top = sorted(p.stem for p in LOWERING.glob("*.py") if p.stem != "__init__")
    assert len(top) <= MAX_LOWERING_TOP, top
    assert "caffe2jax.lowering" not in _registered_by_folder()  # no family at the top


def _reads_form(path: Path) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "form"
    ]


def test_no_module_that_lowers_a_bvlc_type_reads_a_fork_form():
    """A fork's variant of a BVLC type is its own registry entry (``register(..., form=)``),
    never an ``if layer.form`` in the BVLC body."""
    bvlc = {m for kinds in _registered_by_folder().values() for _, _, m in kinds["bvlc"]}
    reads = {m: lines for m in bvlc if (lines := _reads_form(modules()[m]))}
    assert reads == {}
    # and nothing in layers/ registers a form
    keyed = [
        f"{path.name}:{node.lineno}"
        for path in (LOWERING / "layers").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "register"
        and any(k.arg == "form" for k in node.keywords)
    ]  # fmt: skip
    assert keyed == []


def _computes_overlap(fn: ast.FunctionDef) -> bool:
    """A function that computes box overlap: intersection sides from min/max of the corners,
    and a division by a union written ``area + area − intersection``."""
    calls = {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in ast.walk(fn)
        if isinstance(node, ast.Call)
    }
    union = any(
        isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)
        and isinstance(node.left, ast.BinOp) and isinstance(node.left.op, ast.Add)
        for node in ast.walk(fn)
    )  # fmt: skip
    divides = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) for n in ast.walk(fn))
    clipped = calls & {"minimum", "min"} and calls & {"maximum", "max"}
    return bool(clipped) and union and divides


def _overlap_modules(folder: Path, package: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and _computes_overlap(node):
                name = ".".join([package, *path.relative_to(folder).with_suffix("").parts])
                found.setdefault(name, []).append(node.name)
    return found


def test_box_overlap_is_written_once_in_lowering():
    """IoU in JAX lives in lowering/boxes/iou.py, each fork's convention an argument; every
    detection layer calls it."""
    assert _overlap_modules(LOWERING, "caffe2jax.lowering") == {
        "caffe2jax.lowering.boxes.iou": ["iou"]
    }


def test_the_overlap_detector_finds_the_forms_it_replaced():
    """The check above recognises the IoU forms the forks' layers used to write each time."""
    samples = {
        "ssd": "def f(a, b):\n    iw = jnp.minimum(a, b) - jnp.maximum(a, b)\n"
        "    return iw / (area_a + area_b - iw)\n",
        "yolo": "def f(box, boxes):\n    left = jnp.maximum(box, boxes)\n"
        "    right = jnp.minimum(box, boxes)\n    inter = right - left\n"
        "    return inter / (box[2] * box[3] + boxes[2] * boxes[3] - inter)\n",
    }
    for text in samples.values():
        assert _computes_overlap(ast.parse(text).body[0])


def test_no_environment_read_in_lowering_outside_the_engines():
    """Settings reach a net as explicit values (its engine policy, precision) or through the
    one environment table (frontend/environment.py); the engine policy reads its switches
    there, and no other module of lowering/ touches the process environment."""
    reads = []
    for path in sorted(LOWERING.rglob("*.py")):
        if path.parent == LOWERING / "engines":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv"):
                reads.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert reads == []


def test_the_import_paths_users_hold_keep_working():
    """Rooms move; pycaffe's module names, caffe.proto's module, the functional API's and the
    machinery scripts import by path stay where users find them."""
    import importlib

    import caffe2jax

    for name in ("io", "draw", "net_spec", "coord_map", "api", "proto.caffe_pb2"):
        assert importlib.import_module(f"caffe2jax.{name}") is not None
    for name in caffe2jax.__all__:
        assert getattr(caffe2jax, name) is not None
    from caffe2jax.lowering.python_layer import register_python_layer  # noqa: F401
    from caffe2jax.lowering.registry import (  # noqa: F401
        Context,
        NetState,
        ParamDecl,
        lookup,
        lowering_of,
        register,
        registered_types,
    )


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
