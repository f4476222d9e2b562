"""frontend/environment.py: every ``CAFFE2JAX_*`` variable is declared in its one table, listed
in docs/environment.md, and read through its ``value()`` only — no other module of the library
reads one from the process environment."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from caffe2jax.frontend import environment
from caffe2jax.frontend.environment import VARIABLES, value

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("caffe2jax", "frontend", "lowering", "runtime")
PAGE = ROOT / "docs" / "environment.md"


def _sources():
    for folder in LIBRARY:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name != "caffe_pb2.py":
                yield path, ast.parse(path.read_text())


def _names(tree: ast.AST) -> dict[str, str]:
    """Module-level names bound to a CAFFE2JAX_ string (``_ENV = "CAFFE2JAX_..."``)."""
    return {
        t.id: node.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str) and node.value.value.startswith("CAFFE2JAX_")
        for t in node.targets if isinstance(t, ast.Name)
    }  # fmt: skip


def _variable(node: ast.AST, names: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value if node.value.startswith("CAFFE2JAX_") else None
    if isinstance(node, ast.Attribute):  # memory.CGROUP_ENV and the like
        node = ast.Name(node.attr)
    return names.get(node.id) if isinstance(node, ast.Name) else None


def _environment_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, variable) of each read of a CAFFE2JAX_ variable straight from the environment:
    ``os.environ.get(X)``, ``os.getenv(X)``, ``os.environ[X]`` read, ``X in os.environ``."""
    names, found = _names(tree), []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            owner = ast.unparse(node.func.value)
            if (owner.endswith("environ") and node.func.attr in ("get", "pop")) or (
                node.func.attr == "getenv"
            ):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice if ast.unparse(node.value).endswith("environ") else None
        elif isinstance(node, ast.Compare) and any(
            ast.unparse(c).endswith("environ") for c in node.comparators
        ):
            key = node.left
        if key is not None and (name := _variable(key, names)):
            found.append((node.lineno, name))
    return found


def test_only_the_environment_module_reads_caffe2jax_variables():
    reads = {
        str(path.relative_to(ROOT)): found
        for path, tree in _sources()
        if path.name != "environment.py" and (found := _environment_reads(tree))
    }
    assert reads == {}


def test_the_reader_sees_each_way_of_reading():
    tree = ast.parse(
        'import os\n_ENV = "CAFFE2JAX_X"\na = os.environ.get("CAFFE2JAX_A")\n'
        'b = os.environ[_ENV]\nc = os.getenv("CAFFE2JAX_C", "")\nd = _ENV in os.environ\n'
        'os.environ["CAFFE2JAX_W"] = "1"\n'
    )
    found = sorted(name for _, name in _environment_reads(tree))
    assert found == ["CAFFE2JAX_A", "CAFFE2JAX_C", "CAFFE2JAX_X", "CAFFE2JAX_X"]  # no write


def test_every_variable_the_library_names_is_declared_and_every_declared_one_is_used():
    named: set[str] = set()
    for _, tree in _sources():
        named |= {
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and re.fullmatch(r"CAFFE2JAX_[A-Z0-9_]+", node.value)
        }  # fmt: skip
    assert named == set(VARIABLES)


def test_docs_environment_lists_the_table():
    """docs/environment.md has one row per declared variable, in the table's order, naming the
    module that reads it (which exists), and no other CAFFE2JAX_ variable."""
    text = PAGE.read_text()
    rows = re.findall(r"^\| `(CAFFE2JAX_[A-Z0-9_]+)` \|(.*)\|$", text, re.M)
    assert [name for name, _ in rows] == list(VARIABLES)
    for (name, row), variable in zip(rows, VARIABLES.values()):
        assert variable.reader in row and (ROOT / variable.reader).exists(), name
        assert variable.meaning in row, name
    assert "docs/environment.md" in (ROOT / "README.md").read_text()


def test_value_reads_declared_variables_only():
    assert value("CAFFE2JAX_POOL", {"CAFFE2JAX_POOL": " xla"}) == " xla"
    assert value("CAFFE2JAX_POOL", {}) == ""
    with pytest.raises(KeyError, match="CAFFE2JAX_TYPO is not declared"):
        value("CAFFE2JAX_TYPO", {})
    assert environment.__doc__ and "docs/environment.md" in environment.__doc__
