"""The registry of data layer readers (runtime/data/readers/__init__.py): one class per Caffe
type string, every host-fed type of lowering's table has one, and lowering names none."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from caffe2jax.lowering.registry import DATA_LAYERS
from caffe2jax.runtime.data.readers import reader, reader_for, reader_types

ROOT = Path(__file__).resolve().parents[3]


def test_every_host_fed_type_has_its_reader_and_no_other_is_registered():
    fed = {t for t, kind in DATA_LAYERS.items() if kind.feed != "caller"}
    assert set(reader_types()) == fed
    assert reader_for("Input") is None and reader_for("Convolution") is None
    assert reader_for("Data").__name__ == "DataLayerSource"
    assert reader_for("HDF5Output").__name__ == "HDF5OutputSink"
    assert reader_for("MemoryData").__module__.endswith("readers.memory_data")


def test_a_type_has_one_reader():
    with pytest.raises(ValueError, match="two readers for data layer type 'Data'"):
        reader("Data")(type("Another", (), {}))


def test_lowering_names_no_runtime_class():
    """No string of lowering (docstrings aside) names a runtime module or a reader class."""
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef)
    named = []
    for path in sorted((ROOT / "lowering").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, owners) and ast.get_docstring(n, clean=False)}  # fmt: skip
        strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                   and isinstance(n.value, str) and id(n) not in docs]  # fmt: skip
        named += [f"{path.name}: {v}" for v in strings
                  if "runtime.data" in v or v.endswith(("Source", "Sink"))]  # fmt: skip
    assert named == []
