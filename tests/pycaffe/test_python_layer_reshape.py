"""Python layers that reshape their tops in ``forward`` (or ``reshape``), as Caffe allows:
py-faster-rcnn's proposal layer knows its number of proposals only after NMS and calls
``top[0].reshape(n, 5)`` in forward. The layers after it (ROIPooling, InnerProduct,
SoftmaxWithLoss) run at the new shape (lowering/python_class.py, python_blobs.retrace): in
pycaffe's ``net.forward()``, ``solver.step`` and the CLI's ``test`` and ``train``, each checked
against a NumPy computation of the same net at the varying counts (the ROIPooling loops of
tests/lowering/roi_loops.py, the fork's C++ transcribed). Failures inside a Python layer are
one line naming the layer, its module and class."""

from __future__ import annotations

import importlib
import itertools
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import NetError
from tests.cli_runner import run_cli
from tests.lowering.roi_loops import roi_pool_backward, roi_pool_forward

caffe2jax.install_as_caffe()
import caffe  # noqa: E402 - the scripts' own import, through the alias

_names = itertools.count()

# A data layer (a new image and score map per forward, batch i drawn from seed + i) and a
# proposal layer in py-faster-rcnn's manner: tops (1, 5) in setup, "reshaping happens during
# the call to forward" after a threshold and NMS; ``mode: 'reshape'`` counts in reshape().
LAYERS = """
import numpy as np
import caffe

forwards = []


class SyntheticData(caffe.Layer):
    def setup(self, bottom, top):
        self.seed = eval(self.param_str)["seed"]
        self.count = 0
        top[0].reshape(1, 3, 16, 16)
        top[1].reshape(1, 1, 16, 16)

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        image, scores = batch(self.seed + self.count)
        self.count += 1
        top[0].data[...] = image
        top[1].data[...] = scores

    def backward(self, top, propagate_down, bottom):
        pass


def batch(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((1, 3, 16, 16)), rng.uniform(size=(1, 1, 16, 16))


def propose(scores, thresh=0.95, overlap=0.3, post=9, positive=0.97):
    ys, xs = np.nonzero(scores > thresh)
    s = scores[ys, xs]
    order = np.argsort(-s, kind="stable")
    boxes = np.stack([xs - 2, ys - 2, xs + 2, ys + 2], 1)[order].clip(0, 15).astype(np.float32)
    s = s[order]
    area = (boxes[:, 2] - boxes[:, 0] + 1) * (boxes[:, 3] - boxes[:, 1] + 1)
    keep = []
    for i in range(len(boxes)):
        w = np.minimum(boxes[keep, 2], boxes[i, 2]) - np.maximum(boxes[keep, 0], boxes[i, 0]) + 1
        h = np.minimum(boxes[keep, 3], boxes[i, 3]) - np.maximum(boxes[keep, 1], boxes[i, 1]) + 1
        inter = np.maximum(w, 0) * np.maximum(h, 0)
        if np.all(inter / (area[keep] + area[i] - inter) <= overlap):
            keep.append(i)
    if not keep:  # Net::Init's reshape sees zeros, as in Caffe
        return np.zeros((1, 5), np.float32), np.zeros(1, np.float32)
    keep = keep[:post]
    rois = np.hstack([np.zeros((len(keep), 1), np.float32), boxes[keep]])
    return rois, (s[keep] > positive).astype(np.float32)


class Proposal(caffe.Layer):
    def setup(self, bottom, top):
        self.mode = eval(self.param_str or "{}").get("mode", "forward")
        top[0].reshape(1, 5)
        top[1].reshape(1)

    def reshape(self, bottom, top):
        if self.mode == "reshape":
            self.rois, self.labels = propose(bottom[0].data[0, 0])
            top[0].reshape(*self.rois.shape)
            top[1].reshape(*self.labels.shape)

    def forward(self, bottom, top):
        if self.mode == "forward":
            self.rois, self.labels = propose(bottom[0].data[0, 0])
            top[0].reshape(*self.rois.shape)
            top[1].reshape(*self.labels.shape)
        if self.mode == "fail":
            raise KeyError("TRAIN")
        forwards.append(len(self.rois))
        top[0].data[...] = self.rois
        top[1].data[...] = self.labels

    def backward(self, top, propagate_down, bottom):
        pass
"""


def net_text(module: str, mode: str = "forward") -> str:
    return f"""name: "TinyProposals"
layer {{ name: "input" type: "Python" top: "data" top: "scores"
  python_param {{ module: "{module}" layer: "SyntheticData" param_str: "{{'seed': 10}}" }} }}
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "feat"
  convolution_param {{ num_output: 4 kernel_size: 3 pad: 1
    weight_filler {{ type: "gaussian" std: 0.3 }} bias_filler {{ type: "gaussian" std: 0.1 }} }} }}
layer {{ name: "proposal" type: "Python" bottom: "scores" top: "rois" top: "labels"
  python_param {{ module: "{module}" layer: "Proposal" param_str: "{{'mode': '{mode}'}}" }} }}
layer {{ name: "pool" type: "ROIPooling" bottom: "feat" bottom: "rois" top: "pooled"
  roi_pooling_param {{ pooled_w: 2 pooled_h: 2 spatial_scale: 1 }} }}
layer {{ name: "fc" type: "InnerProduct" bottom: "pooled" top: "cls"
  inner_product_param {{ num_output: 2
    weight_filler {{ type: "gaussian" std: 0.2 }} bias_filler {{ type: "gaussian" std: 0.1 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "cls" bottom: "labels" top: "loss" }}
"""


@pytest.fixture
def layers(tmp_path, monkeypatch):
    """The layers' module in a folder on sys.path (as py-faster-rcnn's lib/ is), imported."""
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"c2j_proposals_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(LAYERS))
    yield importlib.import_module(name)
    sys.modules.pop(name, None)


# -- the NumPy net ------------------------------------------------------------------------------


def conv(x, w, b):
    """Caffe's 3×3 pad-1 convolution of one image, in float64."""
    cells = np.lib.stride_tricks.sliding_window_view(np.pad(x[0], ((0, 0), (1, 1), (1, 1))),
                                                     (3, 3), axis=(1, 2))  # fmt: skip
    return (np.einsum("chwij,ocij->ohw", cells, w) + b[:, None, None])[None]


def numpy_pass(module, seed: int, params: dict) -> dict:
    """The net's forward and the gradient of its loss for batch ``seed``."""
    image, scores = module.batch(seed)
    rois, labels = module.propose(scores[0, 0])
    feat = conv(image, *params["conv"]).astype(np.float32)
    pooled, arg = roi_pool_forward(feat, rois, 2, 2, 1.0)
    w, b = params["fc"]
    cls = pooled.reshape(len(rois), -1).astype(np.float64) @ w.T + b
    prob = np.exp(cls - cls.max(1, keepdims=True))
    prob /= prob.sum(1, keepdims=True)
    picked = labels.astype(int)
    loss = -np.log(prob[np.arange(len(rois)), picked]).mean()
    d_cls = prob.copy()
    d_cls[np.arange(len(rois)), picked] -= 1
    d_cls /= len(rois)
    d_pooled = (d_cls @ w).reshape(pooled.shape).astype(np.float32)
    d_feat = roi_pool_backward(feat.shape, rois, arg, d_pooled, 1.0).astype(np.float64)
    cells = np.lib.stride_tricks.sliding_window_view(np.pad(image[0], ((0, 0), (1, 1), (1, 1))),
                                                     (3, 3), axis=(1, 2))  # fmt: skip
    grads = {"conv": [np.einsum("ohw,chwij->ocij", d_feat[0], cells), d_feat[0].sum((1, 2))],
             "fc": [d_cls.T @ pooled.reshape(len(rois), -1), d_cls.sum(0)]}  # fmt: skip
    return {"rois": rois, "labels": labels, "pooled": pooled, "cls": cls, "loss": loss,
            "grads": grads}  # fmt: skip


def params_of(net) -> dict:
    return {
        name: [np.array(b.data, np.float64) for b in net.params[name]] for name in ("conv", "fc")
    }


# -- pycaffe ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["forward", "reshape"])
def test_forward_runs_the_layers_after_at_each_count(layers, tmp_path, mode):
    path = tmp_path / "net.prototxt"
    path.write_text(net_text(layers.__name__, mode))
    net = caffe.Net(str(path), caffe.TEST)
    params = params_of(net)
    counts = []
    for i in range(5):
        out = net.forward()
        want = numpy_pass(layers, 10 + i, params)
        counts.append(len(want["rois"]))
        np.testing.assert_array_equal(net.blobs["rois"].data, want["rois"])
        np.testing.assert_array_equal(net.blobs["labels"].data, want["labels"])
        np.testing.assert_allclose(net.blobs["pooled"].data, want["pooled"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(net.blobs["cls"].data, want["cls"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["loss"], want["loss"], rtol=1e-5)
    assert len(set(counts)) >= 3, counts  # the count did vary
    assert layers.forwards == counts  # one forward of the layer per net.forward()
    # one model per count, kept in the net's bounded family (besides Net::Init's, for 1)
    family = net.model.family()
    assert family.built == len(set(counts)) and len(family) == family.built + 1
    net.forward()  # batch 15 has a count seen before: its model and programs are reused
    assert layers.forwards[-1] in counts and family.built == len(set(counts))


def solver_text(net: Path, **extra) -> str:
    fields = " ".join(f"{k}: {v}" for k, v in extra.items())
    return (f'net: "{net}" base_lr: 0.05 lr_policy: "fixed" momentum: 0 weight_decay: 0 '
            f"max_iter: 4 display: 1 average_loss: 1 random_seed: 3 {fields}")  # fmt: skip


def sgd_trajectory(module, params: dict, iterations: int, lr: float = 0.05) -> list[float]:
    """The losses of ``iterations`` plain SGD steps in NumPy (each on its own batch)."""
    losses = []
    for i in range(iterations):
        step = numpy_pass(module, 10 + i, params)
        losses.append(step["loss"])
        params = {k: [p - lr * g for p, g in zip(params[k], step["grads"][k])] for k in params}
    return losses, params


def test_solver_steps_train_through_the_varying_counts(layers, tmp_path):
    (tmp_path / "net.prototxt").write_text(net_text(layers.__name__))
    (tmp_path / "solver.prototxt").write_text(solver_text(tmp_path / "net.prototxt"))
    solver = caffe.SGDSolver(str(tmp_path / "solver.prototxt"))
    start = params_of(solver.net)
    losses = []
    for _ in range(4):
        solver.step(1)
        losses.append(float(solver.net.blobs["loss"].data))
    want, end = sgd_trajectory(layers, start, 4)
    np.testing.assert_allclose(losses, want, rtol=1e-4, atol=1e-7)
    for name in ("conv", "fc"):
        for got, expected in zip(params_of(solver.net)[name], end[name]):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert len(set(layers.forwards)) >= 2 and len(layers.forwards) == 4


# -- iter_size ----------------------------------------------------------------------------------


def iter_size_trajectory(module, params: dict, iterations: int, iter_size: int = 2,
                         lr: float = 0.05) -> tuple[list[float], list[float], dict]:  # fmt: skip
    """Caffe's Solver::Step at iter_size in NumPy: iter_size ForwardBackward passes, each on
    its own batch (its own proposal count), their diffs summed, Solver::Normalize dividing by
    iter_size, then plain SGD; the iteration's loss is the passes' mean (Step's
    ``loss /= iter_size``). The means, each iteration's last pass's loss, the final params."""
    means, lasts = [], []
    for i in range(iterations):
        steps = [numpy_pass(module, 10 + iter_size * i + k, params) for k in range(iter_size)]
        means.append(float(np.mean([s["loss"] for s in steps])))
        lasts.append(steps[-1]["loss"])
        summed = {name: [sum(s["grads"][name][j] for s in steps) for j in range(len(blobs))]
                  for name, blobs in params.items()}  # fmt: skip
        params = {name: [p - lr * g / iter_size for p, g in zip(params[name], summed[name])]
                  for name in params}  # fmt: skip
    return means, lasts, params


def pass_counts(module, passes: int) -> list[int]:
    return [len(module.propose(module.batch(10 + i)[1][0, 0])[0]) for i in range(passes)]


def test_iter_size_passes_train_each_at_its_own_count(layers, tmp_path):
    """py-R-FCN's OHEM solver runs iter_size 2 with its own proposal layers: the two passes of
    an iteration give different counts, each runs at its own, the gradients accumulate as in
    Caffe."""
    (tmp_path / "net.prototxt").write_text(net_text(layers.__name__))
    (tmp_path / "solver.prototxt").write_text(solver_text(tmp_path / "net.prototxt", iter_size=2))
    solver = caffe.SGDSolver(str(tmp_path / "solver.prototxt"))
    start = params_of(solver.net)
    lasts, shown = [], []
    for _ in range(4):
        solver.step(1)
        lasts.append(float(solver.net.blobs["loss"].data))  # the last pass's, as in Caffe
        # a blob the step did not return: computed from the last pass, at that pass's count
        shown.append(solver.net.blobs["pooled"].data.shape[0])
    counts = pass_counts(layers, 8)
    assert shown == counts[1::2], (shown, counts)
    assert all(a != b for a, b in zip(counts[::2], counts[1::2])), counts  # the passes differ
    assert layers.forwards == counts  # one forward of the layer per pass, none run twice
    _, want, end = iter_size_trajectory(layers, start, 4)
    np.testing.assert_allclose(lasts, want, rtol=1e-4, atol=1e-7)
    for name in ("conv", "fc"):
        for got, expected in zip(params_of(solver.net)[name], end[name]):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


# -- the CLI ------------------------------------------------------------------------------------


def _weights(layers, tmp_path: Path) -> tuple[Path, dict]:
    (tmp_path / "net.prototxt").write_text(net_text(layers.__name__))
    net = caffe.Net(str(tmp_path / "net.prototxt"), caffe.TEST)
    net.save(str(tmp_path / "start.caffemodel"))
    return tmp_path / "start.caffemodel", params_of(net)


def test_cli_test_scores_each_batch_at_its_count(layers, tmp_path, monkeypatch):
    weights, params = _weights(layers, tmp_path)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{Path.cwd()}")
    done = run_cli("test", "--model", tmp_path / "net.prototxt", "--weights", weights,
                   "--iterations", "4", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = [float(v) for v in re.findall(r"Batch \d+, loss = (\S+)", done.stderr)]
    want = [numpy_pass(layers, 10 + i, params)["loss"] for i in range(4)]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_cli_train_follows_the_numpy_trajectory(layers, tmp_path, monkeypatch):
    weights, params = _weights(layers, tmp_path)
    solver = solver_text(tmp_path / "net.prototxt", snapshot_after_train="false")
    (tmp_path / "solver.prototxt").write_text(solver)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{Path.cwd()}")
    done = run_cli("train", "--solver", tmp_path / "solver.prototxt", "--weights", weights,
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = [float(v) for v in re.findall(r"Iteration \d+ \(.*\), loss = (\S+)", done.stderr)]
    want, _ = sgd_trajectory(layers, params, 4)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


# -- failures -----------------------------------------------------------------------------------


def test_a_failing_layer_is_one_line_naming_it(layers, tmp_path, monkeypatch):
    path = tmp_path / "net.prototxt"
    path.write_text(net_text(layers.__name__, "fail"))
    net = caffe.Net(str(path), caffe.TEST)
    where = rf"Python layer 'proposal' \({layers.__name__}\.Proposal\) forward: KeyError: 'TRAIN'"
    with pytest.raises(NetError, match=where) as caught:
        net.forward()
    assert isinstance(caught.value, KeyError)  # a script's own `except KeyError` still works
    assert isinstance(caught.value.__cause__, KeyError) and "\n" not in str(caught.value)
    weights = tmp_path / "w.caffemodel"
    net.save(str(weights))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{Path.cwd()}")
    done = run_cli("test", "--model", path, "--weights", weights, "--iterations", "1")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert re.search(rf"caffe2jax test: error: {where}\n$", done.stderr), done.stderr[-600:]


def test_cli_train_at_iter_size_2_follows_caffes_accumulation(layers, tmp_path, monkeypatch):
    weights, params = _weights(layers, tmp_path)
    solver = solver_text(tmp_path / "net.prototxt", iter_size=2,
                         snapshot_prefix=f'"{tmp_path / "it"}"')  # fmt: skip
    (tmp_path / "solver.prototxt").write_text(solver)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{Path.cwd()}")
    done = run_cli("train", "--solver", tmp_path / "solver.prototxt", "--weights", weights,
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = [float(v) for v in re.findall(r"Iteration \d+ \(.*\), loss = (\S+)", done.stderr)]
    want, _, end = iter_size_trajectory(layers, params, 4)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
    trained = caffe.Net(str(tmp_path / "net.prototxt"), str(tmp_path / "it_iter_4.caffemodel"),
                        caffe.TEST)  # fmt: skip
    for name in ("conv", "fc"):
        for blob, expected in zip(params_of(trained)[name], end[name]):
            np.testing.assert_allclose(blob, expected, rtol=1e-4, atol=1e-5)
