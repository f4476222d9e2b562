"""The training side of real pycaffe scripts, run as the scripts run them (``import caffe``
through caffe2jax.install_as_caffe()): a Python data layer feeding ``solver.step`` (BVLC's
examples/pycaffe/layers/pascal_multilabel_datalayers.py pattern: top shapes set in setup and
reshape, filled in forward, on a tiny synthetic dataset), ``solver.snapshot()`` /
``solver.restore()`` mid-run continuing exactly, features written to HDF5 (h5py) and LMDB by a
loop over ``net.forward()`` and read back, and ``caffe.draw.draw_net_to_file`` of a fork's net
(BVLC's python/draw_net.py)."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest
from google.protobuf import text_format

import caffe2jax

caffe2jax.install_as_caffe()
import caffe  # noqa: E402 - the scripts' own imports, through the alias
import caffe.draw  # noqa: E402
from caffe.proto import caffe_pb2  # noqa: E402

SHARED = Path("/work/shared/forks/models")

# pascal_multilabel_datalayers.py's shape: params from param_str, a batch loader, top shapes in
# setup and reshape, forward filling them; the "images" are 4-vectors, the labels 3 classes.
MULTILABEL = """
import numpy as np
import caffe


class MultilabelDataLayerSync(caffe.Layer):
    def setup(self, bottom, top):
        self.top_names = ["data", "label"]
        params = eval(self.param_str)
        self.batch_size = params["batch_size"]
        self.batch_loader = BatchLoader(params)
        top[0].reshape(self.batch_size, 4)
        top[1].reshape(self.batch_size, 3)

    def forward(self, bottom, top):
        for itt in range(self.batch_size):
            im, multilabel = self.batch_loader.load_next_image()
            top[0].data[itt, ...] = im
            top[1].data[itt, ...] = multilabel

    def reshape(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        pass


class BatchLoader(object):
    def __init__(self, params):
        rng = np.random.default_rng(params["seed"])
        self.images = rng.standard_normal((params["count"], 4)).astype(np.float32)
        self.labels = (self.images[:, :3] > 0).astype(np.float32)
        self._cur = 0

    def load_next_image(self):
        if self._cur == len(self.images):
            self._cur = 0
        index = self._cur
        self._cur += 1
        return self.images[index], self.labels[index]
"""


@pytest.fixture
def multilabel(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"c2j_multilabel_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MULTILABEL))
    yield importlib.import_module(name)
    sys.modules.pop(name, None)


def multilabel_net(module: str) -> str:
    return f"""name: "multilabel"
layer {{ name: "data" type: "Python" top: "data" top: "label"
  python_param {{ module: "{module}" layer: "MultilabelDataLayerSync"
    param_str: "{{'batch_size': 6, 'seed': 5, 'count': 15}}" }} }}
layer {{ name: "score" type: "InnerProduct" bottom: "data" top: "score"
  inner_product_param {{ num_output: 3 weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
layer {{ name: "loss" type: "SigmoidCrossEntropyLoss" bottom: "score" bottom: "label"
  top: "loss" }}
"""


def test_python_data_layer_feeds_solver_step(multilabel, tmp_path):
    """solve.py's loop: solver.step(1) on the layer's batches; the weights follow plain SGD
    on the same batches in NumPy (SigmoidCrossEntropyLoss normalized by the batch)."""
    (tmp_path / "train.prototxt").write_text(multilabel_net(multilabel.__name__))
    (tmp_path / "solver.prototxt").write_text(
        'net: "train.prototxt" base_lr: 0.5 lr_policy: "fixed" momentum: 0 weight_decay: 0 '
        "max_iter: 100 display: 0 random_seed: 2"
    )
    solver = caffe.SGDSolver(str(tmp_path / "solver.prototxt"))
    w = np.array(solver.net.params["score"][0].data, np.float64)
    b = np.array(solver.net.params["score"][1].data, np.float64)
    loader = multilabel.BatchLoader({"seed": 5, "count": 15})
    for _ in range(5):
        solver.step(1)
        batch = [loader.load_next_image() for _ in range(6)]
        x = np.stack([im for im, _ in batch]).astype(np.float64)
        t = np.stack([lab for _, lab in batch]).astype(np.float64)
        np.testing.assert_array_equal(solver.net.blobs["data"].data, x.astype(np.float32))
        p = 1 / (1 + np.exp(-(x @ w.T + b)))
        loss = -(t * np.log(p) + (1 - t) * np.log(1 - p)).sum() / 6
        np.testing.assert_allclose(solver.net.blobs["loss"].data, loss, rtol=1e-5)
        d = (p - t) / 6
        w, b = w - 0.5 * d.T @ x, b - 0.5 * d.sum(0)
    np.testing.assert_allclose(solver.net.params["score"][0].data, w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(solver.net.params["score"][1].data, b, rtol=1e-5, atol=1e-6)


REGRESSION = """name: "regression"
layer { name: "data" type: "Input" top: "x" top: "y"
  input_param { shape { dim: 8 dim: 5 } shape { dim: 8 dim: 1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "x" top: "h"
  inner_product_param { num_output: 6 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "h" top: "h" }
layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "p"
  inner_product_param { num_output: 1 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }
"""


def _feed(solver, rng_seed: int) -> None:
    """The notebook pattern: the script writes each batch into the Input blobs."""
    rng = np.random.default_rng(rng_seed)
    x = rng.standard_normal((8, 5)).astype(np.float32)
    solver.net.blobs["x"].data[...] = x
    solver.net.blobs["y"].data[...] = x[:, :1] * 2 - x[:, 1:2]


def test_snapshot_and_restore_mid_run_continue_exactly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the solver's net path is relative to the cwd, as in Caffe
    (tmp_path / "net.prototxt").write_text(REGRESSION)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt" base_lr: 0.05 lr_policy: "step" stepsize: 3 gamma: 0.5 '
        'momentum: 0.9 weight_decay: 0.001 type: "Nesterov" max_iter: 100 display: 0 '
        f'random_seed: 4 snapshot_prefix: "{tmp_path}/snap"'
    )
    whole = caffe.get_solver(str(tmp_path / "solver.prototxt"))
    for i in range(8):
        _feed(whole, i)
        whole.step(1)
    first = caffe.get_solver(str(tmp_path / "solver.prototxt"))
    for i in range(4):
        _feed(first, i)
        first.step(1)
    first.snapshot()
    state = tmp_path / "snap_iter_4.solverstate"
    assert state.exists() and (tmp_path / "snap_iter_4.caffemodel").exists()
    resumed = caffe.get_solver(str(tmp_path / "solver.prototxt"))
    resumed.restore(str(state))
    assert resumed.iter == 4
    for i in range(4, 8):
        _feed(resumed, i)
        resumed.step(1)
    for name in ("ip1", "ip2"):
        for a, b in zip(whole.net.params[name], resumed.net.params[name]):
            np.testing.assert_array_equal(a.data, b.data)
    np.testing.assert_array_equal(whole.net.blobs["loss"].data, resumed.net.blobs["loss"].data)


def _features(tmp_path: Path):
    (tmp_path / "deploy.prototxt").write_text(REGRESSION.replace(
        'layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }\n', ""
    ))  # fmt: skip
    net = caffe.Net(str(tmp_path / "deploy.prototxt"), caffe.TEST)
    batches = [np.random.default_rng(k).standard_normal((8, 5)).astype(np.float32)
               for k in range(3)]  # fmt: skip
    w1, b1 = (np.array(blob.data) for blob in net.params["ip1"])
    return net, batches, lambda x: np.maximum(x @ w1.T + b1, 0)


def test_features_to_hdf5_and_lmdb_and_back(tmp_path):
    net, batches, numpy_h = _features(tmp_path)
    with h5py.File(tmp_path / "features.h5", "w") as f:  # a script's HDF5 dump
        feats = f.create_dataset("h", (0, 6), maxshape=(None, 6), dtype="f4")
        for x in batches:
            net.blobs["x"].data[...] = x
            net.forward()
            feats.resize(len(feats) + 8, axis=0)
            feats[-8:] = net.blobs["h"].data
    env = lmdb.open(str(tmp_path / "features_lmdb"), map_size=1 << 24)
    with env.begin(write=True) as txn:  # extract_features' layout: one Datum per item
        for k, x in enumerate(batches):
            out = net.forward(x=x, blobs=["h"])
            for j, row in enumerate(out["h"]):
                datum = caffe.io.array_to_datum(row.reshape(6, 1, 1).astype(np.float64))
                txn.put(f"{k * 8 + j:010d}".encode(), datum.SerializeToString())
    want = np.concatenate([numpy_h(x) for x in batches])
    with h5py.File(tmp_path / "features.h5", "r") as f:
        np.testing.assert_allclose(f["h"][:], want, rtol=1e-5, atol=1e-6)
    read = []
    with env.begin() as txn:
        for _, value in txn.cursor():
            datum = caffe_pb2.Datum()
            datum.ParseFromString(value)
            read.append(caffe.io.datum_to_array(datum).ravel())
    np.testing.assert_allclose(np.stack(read), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", ["ssd_mobilenet_voc_test", "faster_rcnn_vgg16_train"])
def test_draw_net_of_a_fork_net(tmp_path, model):
    """python/draw_net.py: text_format.Merge into caffe_pb2.NetParameter, then
    caffe.draw.draw_net_to_file; the .dot file (no Graphviz needed) names every layer and
    links each top to the layers reading it."""
    net = caffe_pb2.NetParameter()
    text_format.Merge((SHARED / f"{model}.prototxt").read_text(), net)
    caffe.draw.draw_net_to_file(net, str(tmp_path / "net.dot"), "LR", caffe.TEST)
    dot = (tmp_path / "net.dot").read_text()
    tested = [layer for layer in net.layer if any(r.phase == caffe.TEST for r in layer.include)]
    layers = [layer for layer in net.layer if not layer.include] + tested
    assert layers and len(layers) > 20
    for layer in layers:
        assert f'"{layer.name}' in dot or f"{layer.name} " in dot, layer.name
    assert dot.count("->") >= len(layers)
