"""Caffe's reshape model and blob semantics in pycaffe (caffe2jax/pycaffe/runner.py), each as
the minimal script a user writes, checked against what Caffe's semantics give (NumPy
references, finite differences):

1. a Blob held across a reshape is the net's blob: a forward on the new shape fills it, what
   the script writes into its diff reaches backward (the deep-dream step);
2. a hand-fed Python data layer (``forward`` does nothing) trains on what the script wrote;
3. a Python data layer whose tops change size (images of several sizes) trains, one compiled
   program per size;
4. ``forward(end=X)`` / ``backward(start=X)`` reshape and check only the layers they run.
"""

from __future__ import annotations

import itertools
import textwrap
import warnings

import jax
import numpy as np
import pytest

import caffe2jax as caffe
from caffe2jax.frontend.errors import NetError

jax.config.update("jax_default_matmul_precision", "highest")

_names = itertools.count()


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write a module of Python layers into a folder on sys.path; returns its unique name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(source: str) -> str:
        name = f"c2j_runner_layers_{next(_names)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


def conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, pad: int) -> np.ndarray:
    """Caffe's convolution (stride 1), float64: out[n,o,i,j] = b[o] + Σ w[o,c,u,v] x[..]."""
    n, c, h, wd = x.shape
    o, _, k, _ = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - k + 1, wd + 2 * pad - k + 1
    out = np.zeros((n, o, oh, ow))
    for u in range(k):
        for v in range(k):
            out += np.einsum("ncij,oc->noij", xp[:, :, u : u + oh, v : v + ow], w[:, :, u, v])
    return out + b.reshape(1, o, 1, 1)


DREAM = """
name: "dream" force_backward: true
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 1 dim: 2 dim: 6 dim: 6 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 3 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.5 }
                            bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
        convolution_param { num_output: 2 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "pool" type: "Pooling" bottom: "conv2" top: "pool"
        pooling_param { pool: AVE kernel_size: 6 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 } } }
"""


def dream_forward(net, x: np.ndarray) -> np.ndarray:
    """conv2's output for input ``x`` (NumPy, float64)."""
    p = net.params
    c1 = np.maximum(conv(x, p["conv1"][0].data, p["conv1"][1].data, 1), 0)
    return conv(c1, p["conv2"][0].data, p["conv2"][1].data, 0)


def test_a_blob_held_across_a_reshape_is_the_nets_blob_and_carries_its_diff():
    """The deep-dream step (issue 23 item 1): ``dst`` taken after the input's reshape and
    before ``forward(end=...)``; the objective's gradient ``dst.diff = dst.data`` reaches the
    input (d/dx ½‖conv2(x)‖², by finite differences on the NumPy forward)."""
    net = caffe.Net(DREAM, caffe.TEST, seed=1)
    src = net.blobs["data"]
    x = np.random.default_rng(0).normal(size=(1, 2, 7, 5)).astype(np.float32)
    src.reshape(1, 2, 7, 5)  # a new image size
    src.data[0] = x[0]
    dst = net.blobs["conv2"]
    held = dst.data  # an array of the old shape: pycaffe would not keep it either
    net.forward(end="conv2")
    assert dst is net.blobs["conv2"] and dst.shape == (1, 2, 7, 5)
    np.testing.assert_allclose(dst.data, dream_forward(net, x), rtol=1e-5, atol=1e-6)
    assert held.shape == (1, 2, 6, 6)
    dst.diff[:] = dst.data  # objective_L2
    net.backward(start="conv2")
    g = src.diff[0]

    def objective(v):
        return 0.5 * np.sum(dream_forward(net, v.reshape(x.shape)) ** 2)

    eps, flat, fd = 1e-4, x.astype(np.float64).ravel(), np.zeros(x.size)
    for i in range(x.size):
        up, down = flat.copy(), flat.copy()
        up[i] += eps
        down[i] -= eps
        fd[i] = (objective(up) - objective(down)) / (2 * eps)
    np.testing.assert_allclose(g.ravel(), fd, rtol=2e-3, atol=1e-4)
    # the same handle follows the next forward at the same shape, and its held array too
    array = dst.data
    src.data[0] *= 2
    net.forward(end="conv2")
    assert dst.data is array
    np.testing.assert_allclose(array, dream_forward(net, 2 * x), rtol=1e-5, atol=1e-5)


def test_forward_end_reshapes_only_the_layers_it_runs():
    """Issue 23 item 4: a 3×3 input is too small for the 6×6 pooling after conv2, but
    ``forward(end='conv2')`` never runs it (Caffe reshapes only the layers in the range);
    ``relu1`` runs in place after ``conv1``, so ``end='conv1'`` shows the convolution alone."""
    net = caffe.Net(DREAM, caffe.TEST, seed=2)
    x = np.random.default_rng(1).normal(size=(1, 2, 3, 3)).astype(np.float32)
    net.blobs["data"].reshape(1, 2, 3, 3)
    net.blobs["data"].data[...] = x
    out = net.forward(end="conv2")
    np.testing.assert_allclose(out["conv2"], dream_forward(net, x), rtol=1e-5, atol=1e-6)
    assert net.blobs["pool"].shape == (1, 2, 1, 1)  # not reshaped: not run
    out = net.forward(end="conv1")
    p = net.params["conv1"]
    np.testing.assert_allclose(out["conv1"], conv(x, p[0].data, p[1].data, 1), rtol=1e-5,
                               atol=1e-6)  # fmt: skip
    net.blobs["conv1"].diff[...] = 1
    grads = net.backward(start="conv1")
    expect = np.einsum("oc,o->c", p[0].data.sum(axis=(2, 3)), np.ones(3))  # interior pixel
    np.testing.assert_allclose(grads["data"][0, :, 1, 1], expect, rtol=1e-5)
    with pytest.raises(NetError, match=r"pool.*Pooling"):
        net.forward()  # the whole net on the small input: the pooling refuses it
    with pytest.raises(NetError, match="reach only up to layer"):
        net.forward(end="conv1")
        net.backward()


HAND_FED = """
import caffe2jax as caffe


class HandFed(caffe.Layer):
    '''A data layer whose data the script sets: forward does nothing.'''

    def setup(self, bottom, top):
        self.batch = int(self.param_str)

    def reshape(self, bottom, top):
        top[0].reshape(self.batch, 3)
        top[1].reshape(self.batch, 1)

    def forward(self, bottom, top):
        pass  # the data is set externally

    def backward(self, top, propagate_down, bottom):
        pass
"""


def hand_fed_net(module: str) -> str:
    return f"""
    layer {{ name: "data" type: "Python" top: "x" top: "y"
      python_param {{ module: "{module}" layer: "HandFed" param_str: "4" }} }}
    layer {{ name: "ip" type: "InnerProduct" bottom: "x" top: "p"
      inner_product_param {{ num_output: 1 weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
    layer {{ name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }}
    """


def test_a_hand_fed_python_data_layer_trains_on_what_the_script_wrote(user_module):
    """Issue 23 item 2: the tops keep what the script wrote until a layer writes them, in
    ``net.forward()`` and in ``solver.step(1)``; SGD (lr 0.1) on EuclideanLoss finds the
    line."""
    module = user_module(HAND_FED)
    rng = np.random.default_rng(2)
    w_true, b_true = np.array([[1.0, -2.0, 0.5]], np.float32), 0.25
    net = caffe.Net(hand_fed_net(module), caffe.TRAIN, seed=0)
    x = rng.normal(size=(4, 3)).astype(np.float32)
    y = x @ w_true.T + b_true
    net.blobs["x"].data[...] = x
    net.blobs["y"].data[...] = y
    loss = net.forward()["loss"]
    w, b = net.params["ip"][0].data, net.params["ip"][1].data
    assert loss == pytest.approx(np.sum((x @ w.T + b - y) ** 2) / 2 / 4, rel=1e-5)
    assert loss > 0.1
    solver = caffe.get_solver(f"""net_param {{ {hand_fed_net(module)} }} base_lr: 0.1
      lr_policy: "fixed" max_iter: 1000 display: 0 random_seed: 1""")
    losses = []
    for _ in range(300):
        x = rng.normal(size=(4, 3)).astype(np.float32)
        solver.net.blobs["x"].data[...] = x
        solver.net.blobs["y"].data[...] = x @ w_true.T + b_true
        w, b = solver.net.params["ip"][0].data.copy(), solver.net.params["ip"][1].data.copy()
        solver.step(1)
        expect = np.sum((x @ w.T + b - (x @ w_true.T + b_true)) ** 2) / 2 / 4
        losses.append(float(solver.net.blobs["loss"].data))
        assert losses[-1] == pytest.approx(expect, rel=1e-4, abs=1e-7)
    np.testing.assert_allclose(solver.net.params["ip"][0].data, w_true, atol=1e-3)
    np.testing.assert_allclose(solver.net.params["ip"][1].data, [b_true], atol=1e-3)


SIZED = """
import numpy as np
import caffe2jax as caffe

SIZES = [(6, 8), (5, 9), (7, 7)]


class Images(caffe.Layer):
    '''Images of several sizes and their per-pixel labels, one per forward (FCN's pattern:
    reshape loads the next image and sizes the tops to it, forward copies it).'''

    def setup(self, bottom, top):
        self.k = 0

    def reshape(self, bottom, top):
        h, w = SIZES[self.k % len(SIZES)]
        rng = np.random.default_rng(self.k)
        self.image = rng.normal(size=(1, 1, h, w)).astype(np.float32)
        self.label = (self.image > 0).astype(np.float32)
        top[0].reshape(1, 1, h, w)
        top[1].reshape(1, 1, h, w)

    def forward(self, bottom, top):
        top[0].data[...] = self.image
        top[1].data[...] = self.label
        self.k += 1
"""


def seg_loss(net, image, label) -> float:
    """SoftmaxWithLoss (normalized over the pixels) of conv(image) against label, NumPy."""
    p = net.params["score"]
    score = conv(image, p[0].data, p[1].data, 1)[0]
    logp = score - np.log(np.exp(score).sum(axis=0, keepdims=True))
    picked = np.take_along_axis(logp, label.astype(int)[0], axis=0)
    return float(-picked.mean())


def test_a_python_data_layer_of_several_image_sizes_trains_per_size(user_module):
    """Issue 23 item 3: the segmentation loop; each step's loss is the NumPy loss of its own
    image under the params before the step, the net's blobs take each image's size, and each
    size is compiled once (three members of the model family, however many steps)."""
    import importlib

    module = user_module(SIZED)
    sizes = importlib.import_module(module).SIZES
    net = f"""
    layer {{ name: "data" type: "Python" top: "data" top: "label"
      python_param {{ module: "{module}" layer: "Images" }} }}
    layer {{ name: "score" type: "Convolution" bottom: "data" top: "score"
      convolution_param {{ num_output: 2 kernel_size: 3 pad: 1
                          weight_filler {{ type: "gaussian" std: 0.3 }} }} }}
    layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss" }}
    """
    solver = caffe.get_solver(f"""net_param {{ {net} }} base_lr: 0.5 lr_policy: "fixed"
      max_iter: 100 display: 0 random_seed: 3""")
    first = []
    for step in range(9):
        before = {k: [b.data.copy() for b in v] for k, v in solver.net.params.items()}
        solver.step(1)
        h, w = sizes[step % 3]
        image, label = solver.net.blobs["data"].data, solver.net.blobs["label"].data
        assert image.shape == (1, 1, h, w) and solver.net.blobs["score"].shape == (1, 2, h, w)
        after = {k: [b.data.copy() for b in v] for k, v in solver.net.params.items()}
        for k, v in solver.net.params.items():
            for blob, value in zip(v, before[k]):
                blob.data[...] = value
        expect = seg_loss(solver.net, image, label)
        for k, v in solver.net.params.items():
            for blob, value in zip(v, after[k]):
                blob.data[...] = value
        assert float(solver.net.blobs["loss"].data) == pytest.approx(expect, rel=1e-4)
        if step < 3:
            first.append(expect)
    assert len(solver.net.model.family()) == 3
    assert seg_loss(solver.net, image, label) < first[2]  # it learns


def test_a_new_shape_on_every_call_is_bounded_and_said_once(monkeypatch):
    monkeypatch.setenv("CAFFE2JAX_MAX_SHAPES", "2")
    net = caffe.Net(DREAM, caffe.TEST, seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for size in (4, 5, 7, 8):
            net.forward(end="conv2", data=np.ones((1, 2, size, size), np.float32))
    said = [w for w in caught if "different input shapes" in str(w.message)]
    assert len(said) == 1 and "CAFFE2JAX_MAX_SHAPES" in str(said[0].message)
    assert "net 'dream'" in str(said[0].message)
    assert len(net.model.family()) == 2
    np.testing.assert_allclose(net.blobs["conv2"].data,
                               dream_forward(net, np.ones((1, 2, 8, 8))), rtol=1e-5)  # fmt: skip
