"""The import paths users hold keep working across the runtime's rooms: pycaffe's module names
(``caffe2jax.io``, ``.draw``, ``.net_spec``, ``.coord_map``, ``.proto.caffe_pb2``), every
public name of ``caffe2jax`` and ``caffe2jax.runtime``, and the runtime names README.md and
docs/ show."""

from __future__ import annotations

import importlib

import pytest

import caffe2jax
import caffe2jax.runtime


@pytest.mark.parametrize("name", ["io", "draw", "net_spec", "coord_map"])
def test_pycaffe_module_names(name):
    module = importlib.import_module(f"caffe2jax.{name}")
    assert module is importlib.import_module(f"caffe2jax.pycaffe.{name}")
    assert getattr(caffe2jax, name) is module


def test_every_public_name_of_the_package_and_the_runtime_resolves():
    import caffe2jax.proto.caffe_pb2 as caffe_pb2

    assert caffe_pb2.NetParameter
    for module in (caffe2jax, caffe2jax.runtime):
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"


@pytest.mark.parametrize("path", [
    "caffe2jax.runtime:SolverLoop", "caffe2jax.runtime:TrainState",
    "caffe2jax.runtime.data:set_default_workers", "caffe2jax.runtime.data:ItemSource",
    "caffe2jax.runtime.rl:PolicyGradientTrainer",
    "caffe2jax.runtime.outputs.detections:from_detection_output",
    "caffe2jax.runtime.outputs.detections:from_rcnn",
])  # fmt: skip
def test_documented_runtime_names(path):
    module, name = path.split(":")
    assert getattr(importlib.import_module(module), name) is not None
