"""The worked example of docs/forks.md ("Bringing your own fork", examples/fork_rcf): RCF's
AutoCrop from its fork's caffe.proto to training, through the API and `caffe2jax train
--dialect rcf.proto --layers rcf_layers.py`; and the one-line errors around it."""

from __future__ import annotations

import importlib.util
import re
import shutil

import jax
import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering import registry
from tests.cli_runner import run_cli
from tests.golden import ROOT

EXAMPLE = ROOT / "examples" / "fork_rcf"


@pytest.fixture
def example(tmp_path):
    for name in ("rcf.proto", "rcf_layers.py", "rcf_side_output.prototxt", "solver.prototxt"):
        shutil.copy(EXAMPLE / name, tmp_path / name)
    return tmp_path


def _register_example():
    spec = importlib.util.spec_from_file_location("rcf_layers", EXAMPLE / "rcf_layers.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _auto_crop_loop(x, ref_shape, crop_h, crop_w):
    """AutoCropLayer::Forward_cpu (yun-liu/rcf auto_crop_layer.cpp): per (n, c, h) one row
    copied from bottom[0] at (n, c, crop_h + h, crop_w)."""
    n, c = x.shape[:2]
    height, width = ref_shape[2], ref_shape[3]
    top = np.empty((n, c, height, width), x.dtype)
    for i, j, h in np.ndindex(n, c, height):
        top[i, j, h, :] = x[i, j, crop_h + h, crop_w : crop_w + width]
    return top


@pytest.fixture
def builtin_auto_crop():
    """The built-in AutoCrop put back after the test: the user's registration replaces it for
    the whole process, and later tests in the same worker (tests/lowering/forks/test_rcf.py)
    lower the built-in one."""
    builtin = registry.lowering_of("AutoCrop")
    yield
    registry.unregister("AutoCrop", "", restore=builtin)


def test_auto_crop_matches_the_fork_jitted_and_in_value_and_grad(builtin_auto_crop):
    with pytest.warns(UserWarning, match="'AutoCrop' is built into caffe2jax"):
        _register_example()  # the user's AutoCrop replaces the built-in one
    model = caffe2jax.compile(EXAMPLE / "rcf_side_output.prototxt", phase="TRAIN",
                              dialect=str(EXAMPLE / "rcf.proto"))  # fmt: skip
    params, state = model.init(jax.random.key(0))
    rng = jax.random.key(1)
    blobs, _ = jax.jit(lambda p: model.apply(p, state, {}, rng=rng))(params)
    want = _auto_crop_loop(np.asarray(blobs["score-up"]), blobs["data"].shape, 1, 1)
    np.testing.assert_array_equal(blobs["upscore"], want)
    assert blobs["upscore"].shape == (2, 1, 16, 16)

    def loss(p):
        return model.apply(p, state, {}, rng=rng)[0]["loss"]

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    assert np.isfinite(value) and np.abs(grads["score"][0]).sum() > 0
    assert not np.any(grads["upsample"][0])  # its param { lr_mult: 0 } still gets no update
    # the built-in AutoCrop finds the example's offset (1, 1) from the coordinate maps
    crop = next(layer for layer in model.net.layers if layer.name == "crop")
    assert tuple(crop.param.crop_param.offset) == (1, 1)


def test_train_from_the_command_line(example, builtin_auto_crop):
    proc = run_cli("train", "--solver", "solver.prototxt", "--dialect", "rcf.proto",
                   "--layers", "rcf_layers.py", "--progress", "log", cwd=example)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    losses = [float(v) for v in re.findall(r"Iteration \d+ .*loss = ([-\d.e+]+)", proc.stderr)]
    assert len(losses) >= 5 and all(np.isfinite(losses))
    assert "LayerParameter field 147 (auto_crop_param here) is swish_param in BVLC" in proc.stderr
    weights = example / "rcf_side_output_iter_5.caffemodel"
    _register_example()
    model = caffe2jax.compile(example / "rcf_side_output.prototxt", phase="TRAIN",
                              dialect=str(example / "rcf.proto"))  # fmt: skip
    params, _ = caffe2jax.load_weights(weights, model)
    assert params["score"][0].shape == (1, 8, 1, 1)
    fresh, _ = model.init(jax.random.key(0))
    assert not np.allclose(params["score"][0], fresh["score"][0])  # trained, then reloaded


def _one_line(proc) -> str:
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    (line,) = [ln for ln in proc.stderr.strip().splitlines() if "error:" in ln]
    return line


def test_type_no_one_registered_is_one_line(example):
    # AutoCrop is built in (lowering/forks/rcf.py): a type of the fork no one registered
    net = example / "rcf_side_output.prototxt"
    net.write_text(net.read_text().replace('type: "AutoCrop"', 'type: "SideCrop"'))
    proc = run_cli("time", "--model", "rcf_side_output.prototxt", "--dialect", "rcf.proto",
                   "--iterations", "1", cwd=example)  # fmt: skip
    line = _one_line(proc)
    assert "rcf_side_output.prototxt:22: layer 'crop' has unsupported type 'SideCrop'" in line
    assert "caffe2jax.register_layer" in line and "--layers MODULE" in line
    # through a solver too: the net file's line
    proc = run_cli("train", "--solver", "solver.prototxt", "--dialect", "rcf.proto",
                   cwd=example)  # fmt: skip
    line = _one_line(proc)
    assert "rcf_side_output.prototxt:22: layer 'crop' has unsupported type 'SideCrop'" in line


def test_pycaffe_solver_takes_the_forks_proto_as_dialect(example):
    """get_solver / SGDSolver(dialect=...) as Net(dialect=...): no activate() needed."""
    import caffe2jax as pycaffe  # caffe.get_solver, caffe.SGDSolver
    from caffe2jax.frontend.forks import user_proto

    user_proto.activate(None)
    solver_file = str(example / "solver.prototxt")
    solver = pycaffe.get_solver(solver_file, dialect=str(example / "rcf.proto"))
    assert type(solver).__name__ == "SGDSolver"
    solver.step(2)
    assert np.isfinite(solver.net.blobs["loss"].data).all()
    net = example / "rcf_side_output.prototxt"
    net.write_text(net.read_text().replace('type: "AutoCrop"', 'type: "SideCrop"'))
    with pytest.raises(NetError, match=r"rcf_side_output\.prototxt:22: layer 'crop' "
                                                  "has unsupported type 'SideCrop'"):  # fmt: skip
        pycaffe.SGDSolver(solver_file, dialect=str(example / "rcf.proto"))


def test_bad_proto_and_bad_module_are_one_line(example):
    (example / "bad.proto").write_text('syntax = "proto2";\npackage caffe\nmessage X {}\n')
    line = _one_line(run_cli("train", "--solver", "solver.prototxt", "--dialect", "bad.proto",
                             cwd=example))  # fmt: skip
    assert re.search(r"error: \S*bad\.proto:3:1: Expected \";\"", line), line
    (example / "broken.py").write_text("raise RuntimeError('no such kernel')\n")
    line = _one_line(run_cli("train", "--solver", "solver.prototxt", "--dialect", "rcf.proto",
                             "--layers", "broken", cwd=example))  # fmt: skip
    assert line.endswith("error: --layers broken: RuntimeError: no such kernel"), line
