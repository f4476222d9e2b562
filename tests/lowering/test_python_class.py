"""Class-style Python layers (caffe.Layer subclasses imported from sys.path), run inside the
compiled program through host callbacks; trained by the solver; their exceptions."""

from __future__ import annotations

import itertools
import textwrap

import jax
import numpy as np
import pytest

import caffe2jax as caffe
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from caffe2jax.lowering.python_class import TopsReshaped, user_errors
from tests import jitted

_names = itertools.count()

# Caffe's examples/pycaffe/layers/pyloss.py, re-typed.
PYLOSS = """
import numpy as np
import caffe2jax as caffe


class EuclideanLossLayer(caffe.Layer):
    def setup(self, bottom, top):
        if len(bottom) != 2:
            raise Exception("Need two inputs to compute distance.")

    def reshape(self, bottom, top):
        if bottom[0].count != bottom[1].count:
            raise Exception("Inputs must have the same dimension.")
        self.diff = np.zeros_like(bottom[0].data, dtype=np.float32)
        top[0].reshape(1)

    def forward(self, bottom, top):
        self.diff[...] = bottom[0].data - bottom[1].data
        top[0].data[...] = np.sum(self.diff**2) / bottom[0].num / 2.0

    def backward(self, top, propagate_down, bottom):
        for i in range(2):
            if not propagate_down[i]:
                continue
            sign = 1 if i == 0 else -1
            bottom[i].diff[...] = sign * self.diff / bottom[i].num
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write a module of Python layers into a folder on sys.path; returns its unique name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(source: str) -> str:
        name = f"c2j_user_layers_{next(_names)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


def tail_net(loss_layer: str) -> str:
    """LeNet's tail (ip1 → relu1 → ip2) on pool2-sized inputs, regressing a 10-d target."""
    return f"""
    name: "LeNetTail"
    layer {{ name: "data" type: "Input" top: "data" top: "target"
      input_param {{ shape {{ dim: 8 dim: 50 dim: 4 dim: 4 }} shape {{ dim: 8 dim: 10 }} }} }}
    layer {{ name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
      param {{ lr_mult: 1 }} param {{ lr_mult: 2 }}
      inner_product_param {{ num_output: 500 weight_filler {{ type: "xavier" }}
                             bias_filler {{ type: "constant" }} }} }}
    layer {{ name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }}
    layer {{ name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
      param {{ lr_mult: 1 }} param {{ lr_mult: 2 }}
      inner_product_param {{ num_output: 10 weight_filler {{ type: "xavier" }}
                             bias_filler {{ type: "constant" }} }} }}
    {loss_layer}
    """


def solver_text(net: str) -> str:
    return f"""
    net_param {{ {net} }}
    base_lr: 0.01 momentum: 0.9 weight_decay: 0.0005
    lr_policy: "inv" gamma: 0.0001 power: 0.75
    max_iter: 100 display: 0 random_seed: 7 solver_mode: CPU
    """


def test_numpy_euclidean_loss_trains_lenet_tail_like_the_builtin(user_module):
    module = user_module(PYLOSS)
    python_loss = f"""layer {{ name: "loss" type: "Python" bottom: "ip2" bottom: "target"
      top: "loss" python_param {{ module: "{module}" layer: "EuclideanLossLayer" }}
      loss_weight: 1 }}"""
    builtin_loss = """layer { name: "loss" type: "EuclideanLoss" bottom: "ip2"
      bottom: "target" top: "loss" }"""
    solvers = [caffe.get_solver(solver_text(tail_net(x))) for x in (python_loss, builtin_loss)]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 50, 4, 4)).astype(np.float32)
    y = rng.standard_normal((8, 10)).astype(np.float32)
    for s in solvers:
        s.net.blobs["data"].data[...] = x
        s.net.blobs["target"].data[...] = y
    names = [(layer, i) for layer in ("ip1", "ip2") for i in range(2)]
    for layer, i in names:  # same seed, same fillers: both start from the same weights
        np.testing.assert_array_equal(
            solvers[0].net.params[layer][i].data, solvers[1].net.params[layer][i].data
        )
    worst, start = 0.0, None
    for _ in range(12):
        for s in solvers:
            s.step(1)
        for layer, i in names:
            ours, builtin = (s.net.params[layer][i].data for s in solvers)
            err = np.linalg.norm(ours - builtin) / np.linalg.norm(builtin)
            worst = max(worst, err)
        start = start if start is not None else solvers[1].net.params["ip2"][0].data.copy()
    assert worst <= 1e-5, worst
    # the weights moved: this compared a real trajectory
    assert np.linalg.norm(solvers[1].net.params["ip2"][0].data - start) > 1e-3


def test_linreg_example_forward_and_gradients(user_module):
    """examples/pycaffe/linreg.prototxt's layer: loss and input gradients as the formula."""
    module = user_module(PYLOSS)
    net = f"""
    layer {{ name: "in" type: "Input" top: "a" top: "b"
      input_param {{ shape {{ dim: 10 dim: 3 dim: 2 }} shape {{ dim: 10 dim: 3 dim: 2 }} }} }}
    layer {{ type: 'Python' name: 'loss' top: 'loss' bottom: 'a' bottom: 'b'
      python_param {{ module: '{module}' layer: 'EuclideanLossLayer' }} loss_weight: 1 }}
    force_backward: true
    """
    model = compile_net(net)
    params, state = model.init(0)
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((10, 3, 2)).astype(np.float32) for _ in range(2))

    def loss(a, b):
        return model.loss(params, state, {"a": a, "b": b})[0]

    value, (da, db) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(a, b)
    np.testing.assert_allclose(value, np.sum((a - b) ** 2) / 10 / 2, rtol=1e-6)
    np.testing.assert_allclose(da, (a - b) / 10, rtol=1e-6)
    np.testing.assert_allclose(db, -(a - b) / 10, rtol=1e-6)
    assert model.net.shapes[model.net.blob_names["loss"]] == (1,)


ATTRIBUTES = """
import numpy as np
import caffe2jax as caffe

seen = []


class Probe(caffe.Layer):
    def setup(self, bottom, top):
        seen.append(("setup", self.param_str, self.phase, bottom[0].num, bottom[0].channels))
        self.blobs.add_blob(bottom[0].channels)
        self.blobs[0].data[...] = np.arange(bottom[0].channels) + 1.0

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data * self.blobs[0].data[None, :]

    def backward(self, top, propagate_down, bottom):
        seen.append(("backward", list(propagate_down)))
        bottom[0].diff[...] = top[0].diff * self.blobs[0].data[None, :]
        self.blobs[0].diff[...] = (top[0].diff * bottom[0].data).sum(axis=0)
"""


def probe_net(module, phase="TRAIN"):
    return f"""
    force_backward: true
    layer {{ name: "in" type: "Input" top: "x" input_param {{ shape {{ dim: 4 dim: 3 }} }} }}
    layer {{ name: "probe" type: "Python" bottom: "x" top: "y"
      python_param {{ module: "{module}" layer: "Probe" param_str: "cfg {phase}" }} }}
    """


def test_param_str_phase_blobs_and_their_gradient(user_module):
    import importlib

    module = user_module(ATTRIBUTES)
    for phase, value in (("TRAIN", caffe.TRAIN), ("TEST", caffe.TEST)):
        compile_net(probe_net(module, phase), phase=phase)
        seen = importlib.import_module(module).seen
        assert seen[-1] == ("setup", f"cfg {phase}", value, 4, 3)
    model = compile_net(probe_net(module), phase="TRAIN")
    params, state = model.init(0)
    np.testing.assert_array_equal(params["probe"][0], [1.0, 2.0, 3.0])  # setup's values
    x = np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32)

    def out(params, x):
        return jitted.forward(model, params, state, {"x": x})[0]["y"]

    y, vjp = jax.vjp(out, params, x)
    dy = np.ones((4, 3), np.float32)
    dparams, dx = vjp(dy)
    np.testing.assert_allclose(y, x * [1.0, 2.0, 3.0], rtol=1e-6)
    np.testing.assert_allclose(dx, dy * [1.0, 2.0, 3.0], rtol=1e-6)
    np.testing.assert_allclose(dparams["probe"][0], x.sum(axis=0), rtol=1e-5)
    assert importlib.import_module(module).seen[-1] == ("backward", [True])


def test_propagate_down_is_false_for_a_bottom_without_gradient(user_module):
    """A Python loss against an Input label: Caffe computes no diff for the label."""
    import importlib

    module = user_module(PYLOSS.replace("    def backward(self, top, propagate_down, bottom):\n",
                                        "    def backward(self, top, propagate_down, bottom):\n"
                                        "        flags.append(list(propagate_down))\n")
                         + "\nflags = []\n")  # fmt: skip
    model = compile_net(
        tail_net(f"""layer {{ name: "loss" type: "Python" bottom: "ip2"
      bottom: "target" top: "loss" python_param {{ module: "{module}"
      layer: "EuclideanLossLayer" }} loss_weight: 1 }}""")
    )
    params, state = model.init(0)
    inputs = {"data": np.ones((8, 50, 4, 4), np.float32), "target": np.zeros((8, 10), np.float32)}
    jax.grad(lambda p: model.loss(p, state, inputs)[0])(params)
    assert importlib.import_module(module).flags == [[True, False]]


RAISING = """
import caffe2jax as caffe


class LayerProblem(Exception):
    pass


class Raises(caffe.Layer):
    def setup(self, bottom, top):
        if self.param_str == "setup":
            raise LayerProblem("setup refused: bad param_str")

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)
        if self.param_str == "grow":
            top[0].reshape(bottom[0].num + int(bottom[0].data.sum() != 0), 3)

    def forward(self, bottom, top):
        if self.param_str == "forward":
            raise LayerProblem("forward failed on purpose")
        top[0].data[: bottom[0].num] = bottom[0].data

    def backward(self, top, propagate_down, bottom):
        raise KeyError("backward lost its key")
"""


def raising_net(module, when):
    return f"""
    force_backward: true
    layer {{ name: "in" type: "Input" top: "x" input_param {{ shape {{ dim: 4 dim: 3 }} }} }}
    layer {{ name: "bad" type: "Python" bottom: "x" top: "y"
      python_param {{ module: "{module}" layer: "Raises" param_str: "{when}" }} }}
    """


def test_user_exceptions_keep_their_type_and_message(user_module):
    import importlib

    module = user_module(RAISING)
    problem = importlib.import_module(module).LayerProblem
    with pytest.raises(problem, match="setup refused: bad param_str"):
        caffe.Net(raising_net(module, "setup"), caffe.TEST)  # at build time: raised as is
    model = compile_net(raising_net(module, "forward"))
    params, state = model.init(0)
    apply = jax.jit(lambda x: jitted.forward(model, params, state, {"x": x})[0]["y"])
    # a GPU returns from the call before running it: the error comes with the result
    with pytest.raises(problem, match="forward failed on purpose"), user_errors():
        jax.block_until_ready(apply(np.ones((4, 3), np.float32)))
    model = compile_net(raising_net(module, "backward"))
    grad = jax.jit(jax.grad(lambda x: jitted.forward(model, params, state, {"x": x})[0]["y"].sum()))
    with pytest.raises(KeyError, match="backward lost its key"), user_errors():
        jax.block_until_ready(grad(np.ones((4, 3), np.float32)))


def test_top_shape_changing_in_a_program_compiled_by_hand_is_one_line(user_module):
    """Outside caffe2jax's own runs (which compile the new shapes and run the pass again,
    tests/pycaffe/test_python_layer_reshape.py) a reshape the program cannot take is named."""
    module = user_module(RAISING)
    model = compile_net(raising_net(module, "grow"))
    params, state = model.init(0)
    with (
        pytest.raises(
            TopsReshaped,
            match=rf"Python layer 'bad' \({module}.Raises\): its "
            r"forward reshaped its tops to \[\[5, 3\]\] \(compiled for \[\[4, 3\]\]\)",
        ),
        user_errors(),
    ):
        apply = jax.jit(lambda x: jitted.forward(model, params, state, {"x": x})[0]["y"])
        jax.block_until_ready(apply(np.ones((4, 3), "f4")))


def test_missing_module_and_class_are_one_line_errors(user_module):
    with pytest.raises(NetError, match="module 'c2j_nowhere' is not on sys.path"):
        compile_net(raising_net("c2j_nowhere", "x"))
    module = user_module(RAISING)
    text = raising_net(module, "x").replace('layer: "Raises"', 'layer: "Nope"')
    with pytest.raises(NetError, match=f"module '{module}' .* has no class 'Nope'"):
        compile_net(text)


def test_user_exception_reaches_solver_step_caller(user_module):
    import importlib

    module = user_module(RAISING)
    problem = importlib.import_module(module).LayerProblem
    net = raising_net(module, "forward").replace("force_backward: true", "")
    net += """layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "x" top: "l" }"""
    solver = caffe.get_solver(solver_text(net))
    with pytest.raises(problem, match="forward failed on purpose"):
        solver.step(1)


# The PASCAL multilabel pattern: a top-only layer that reads files in forward.
FILE_DATA = """
import os
import numpy as np
import caffe2jax as caffe

reads = []


class FileData(caffe.Layer):
    def setup(self, bottom, top):
        params = eval(self.param_str)
        self.folder, self.batch_size = params["folder"], params["batch_size"]
        self.files = sorted(os.listdir(self.folder))
        self.cursor = 0
        if len(bottom) != 0:
            raise Exception("FileData is a data layer: no bottoms")
        top[0].reshape(self.batch_size, 4)
        top[1].reshape(self.batch_size, 1)

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        for i in range(self.batch_size):
            name = self.files[self.cursor]
            self.cursor = (self.cursor + 1) % len(self.files)
            record = np.load(os.path.join(self.folder, name))
            top[0].data[i] = record[:4]
            top[1].data[i] = record[4]
            reads.append(name)

    def backward(self, top, propagate_down, bottom):
        pass
"""


def test_python_data_layer_feeds_solver_training(user_module, tmp_path):
    import importlib

    folder = tmp_path / "records"
    folder.mkdir()
    rng = np.random.default_rng(3)
    w_true = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
    for k in range(24):
        x = rng.standard_normal(4).astype(np.float32)
        np.save(folder / f"r{k:02d}.npy", np.append(x, x @ w_true + 0.5).astype(np.float32))
    module = user_module(FILE_DATA)
    net = f"""
    layer {{ name: "data" type: "Python" top: "x" top: "y"
      python_param {{ module: "{module}" layer: "FileData"
        param_str: "{{'folder': '{folder}', 'batch_size': 8}}" }} }}
    layer {{ name: "ip" type: "InnerProduct" bottom: "x" top: "p"
      inner_product_param {{ num_output: 1 weight_filler {{ type: "constant" }} }} }}
    layer {{ name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }}
    """
    solver = caffe.get_solver(f"""net_param {{ {net} }} base_lr: 0.1 momentum: 0.9
      lr_policy: "fixed" max_iter: 1000 display: 0 random_seed: 1""")
    reads = importlib.import_module(module).reads
    solver.step(1)
    # the notebook pattern: look at the batch and the diffs after a step; the views show
    # what the step read and computed, without reading the files again
    records = [np.load(folder / name) for name in reads[:8]]
    np.testing.assert_allclose(solver.net.blobs["x"].data, [r[:4] for r in records])
    assert solver.net.blobs["p"].diff.shape == (8, 1) and np.abs(solver.net.blobs["p"].diff).max()
    assert len(reads) == 8
    solver.step(199)
    assert len(reads) == 200 * 8  # one forward per iteration, 8 records each
    assert reads[:24] == [f"r{k:02d}.npy" for k in range(24)]  # in the layer's own order
    np.testing.assert_allclose(solver.net.params["ip"][0].data.ravel(), w_true, atol=1e-2)
    np.testing.assert_allclose(solver.net.params["ip"][1].data, [0.5], atol=1e-2)


def test_backward_sees_the_state_of_its_own_forward(user_module):
    """pyloss keeps self.diff from forward; a second forward before the first backward must
    not leak into it."""
    module = user_module(PYLOSS)
    model = compile_net(f"""
    force_backward: true
    layer {{ name: "in" type: "Input" top: "a" top: "b"
      input_param {{ shape {{ dim: 4 dim: 3 }} shape {{ dim: 4 dim: 3 }} }} }}
    layer {{ type: 'Python' name: 'loss' top: 'loss' bottom: 'a' bottom: 'b'
      python_param {{ module: '{module}' layer: 'EuclideanLossLayer' }} loss_weight: 1 }}""")
    params, state = model.init(0)
    rng = np.random.default_rng(4)
    a1, a2, b = (rng.standard_normal((4, 3)).astype(np.float32) for _ in range(3))

    def loss(a):
        return model.loss(params, state, {"a": a, "b": b})[0]

    _, vjp1 = jax.vjp(loss, a1)
    _, vjp2 = jax.vjp(loss, a2)
    np.testing.assert_allclose(vjp1(np.float32(1))[0], (a1 - b) / 4, rtol=1e-6)
    np.testing.assert_allclose(vjp2(np.float32(1))[0], (a2 - b) / 4, rtol=1e-6)


def test_solver_trains_a_python_layers_own_blobs(user_module):
    """self.blobs are learnable params: the solver moves them with backward's blob diffs."""
    module = user_module(ATTRIBUTES)
    net = f"""
    layer {{ name: "in" type: "Input" top: "x" top: "t"
      input_param {{ shape {{ dim: 4 dim: 3 }} shape {{ dim: 4 dim: 3 }} }} }}
    layer {{ name: "probe" type: "Python" bottom: "x" top: "y"
      python_param {{ module: "{module}" layer: "Probe" param_str: "" }} }}
    layer {{ name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "loss" }}
    """
    solver = caffe.get_solver(solver_text(net).replace("momentum: 0.9", "momentum: 0.5"))
    x = np.random.default_rng(5).standard_normal((4, 3)).astype(np.float32)
    solver.net.blobs["x"].data[...] = x
    solver.net.blobs["t"].data[...] = x * np.array([-1.0, 0.5, 4.0], np.float32)
    np.testing.assert_array_equal(solver.net.params["probe"][0].data, [1.0, 2.0, 3.0])
    solver.step(300)
    np.testing.assert_allclose(solver.net.params["probe"][0].data, [-1.0, 0.5, 4.0], atol=5e-2)
