"""Caffe's Phase as pycaffe scripts and Python layers see it (frontend/phase.py), and which
implementation runs a fork Python layer caffe2jax has built in (lowering/python_layer.py's
``python_layers`` / ``$CAFFE2JAX_PYTHON_LAYERS``)."""

from __future__ import annotations

import copy
import logging
import pickle
import sys
import textwrap

import numpy as np
import pytest

import caffe2jax as caffe
from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import NetError
from caffe2jax.frontend.phase import Phase
from tests.lowering.opencv_parity import input_layer


def test_phase_values_behave_as_boost_enum_values():
    assert caffe.TRAIN == 0 and caffe.TEST == 1 and isinstance(caffe.TRAIN, int)
    assert caffe.TRAIN == caffe_pb2.TRAIN and caffe.TEST == caffe_pb2.TEST
    assert str(caffe.TRAIN) == "TRAIN" and str(caffe.TEST) == "TEST"
    assert f"{caffe.TEST}" == "TEST" and f"{caffe.TEST:d}" == "1" and "%d" % caffe.TEST == "1"  # noqa: UP031
    assert repr(caffe.TRAIN) == "caffe._caffe.Phase.TRAIN"
    assert ["a", "b"][caffe.TEST] == "b" and {0: "train"}[caffe.TRAIN] == "train"
    assert int(caffe.TEST) == 1 and type(int(caffe.TEST)) is int and caffe.TEST + 1 == 2
    assert caffe.TEST.name == "TEST" and type(caffe.TEST) is caffe.Phase
    assert caffe.Phase.names == {"TRAIN": caffe.TRAIN, "TEST": caffe.TEST}
    assert caffe.Phase.values == {0: caffe.TRAIN, 1: caffe.TEST}
    assert Phase(1) is caffe.TEST and Phase(caffe_pb2.TRAIN) is caffe.TRAIN
    assert pickle.loads(pickle.dumps(caffe.TEST)) is caffe.TEST
    assert copy.deepcopy(caffe.TRAIN) is caffe.TRAIN
    assert not caffe.TRAIN and caffe.TEST  # truth as the int, as Boost's
    assert caffe.TRAIN != "TRAIN"


CONFIG_LAYER = """
import numpy as np
import caffe2jax as caffe

# py-faster-rcnn's fast_rcnn.config: one section per phase, looked up by str(self.phase)
cfg = {"TRAIN": 12000.0, "TEST": 6000.0}


class ByPhase(caffe.Layer):
    def setup(self, bottom, top):
        self.value = cfg[str(self.phase)]
        self.seen = (self.phase, type(self.phase).__name__, repr(self.phase))

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data + self.value + [10, 20][self.phase]
"""

PHASE_NET = input_layer({"x": (1, 2)}) + (
    'layer { name: "p" type: "Python" bottom: "x" top: "y" '
    'python_param { module: "by_phase" layer: "ByPhase" } }\n'
    'layer { name: "twice" type: "Scale" bottom: "y" top: "z" '
    "scale_param { axis: 0 filler { value: 2 } } }\n"
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write a user's module onto sys.path (forgotten after the test)."""
    written = []

    def write(name: str, source: str) -> None:
        path = tmp_path.joinpath(*name.split("."))
        for folder in [p for p in reversed(path.parents) if tmp_path in p.parents]:
            folder.mkdir(exist_ok=True)
            (folder / "__init__.py").touch()
        path.with_suffix(".py").write_text(textwrap.dedent(source))
        written.append(name)

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    for name in [m for m in sys.modules if any(m.startswith(w.split(".")[0]) for w in written)]:
        del sys.modules[name]


@pytest.mark.parametrize(("phase", "value"), [(caffe.TRAIN, 12010.0), (caffe.TEST, 6020.0)])
def test_a_python_layer_keys_its_config_by_str_of_its_phase(user_module, phase, value):
    user_module("by_phase", CONFIG_LAYER)
    net = caffe.Net(PHASE_NET, phase)
    net.blobs["x"].data[...] = [[1.0, 2.0]]
    out = net.forward()  # compiled: the layer runs in a host callback, the Scale after it
    np.testing.assert_array_equal(out["z"], 2 * (np.array([[1.0, 2.0]]) + value))
    layer = net.layer_dict["p"]
    assert layer.seen == (phase, "Phase", f"caffe._caffe.Phase.{phase.name}")
    assert net.layers[-1].phase is phase and str(net.layers[-1].phase) == phase.name


# -- which implementation runs a fork Python layer caffe2jax has built in ------------------------

PROPOSAL_NET = input_layer({"prob": (1, 18, 4, 4), "deltas": (1, 36, 4, 4), "im_info": (1, 3)}) + (
    'layer { name: "rois" type: "Python" bottom: "prob" bottom: "deltas" bottom: "im_info" '
    'top: "rois" python_param { module: "rpn.proposal_layer" layer: "ProposalLayer" '
    "param_str: \"'feat_stride': 16\" } }\n"
)

USER_PROPOSALS = """
import caffe2jax as caffe


class ProposalLayer(caffe.Layer):
    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        top[0].reshape(1, 5)

    def forward(self, bottom, top):
        top[0].data[...] = [[0, 1, 2, 3, 4]]
"""

# py-faster-rcnn's proposal_layer imports its compiled NMS; without the built Cython module
# the import fails
BROKEN_PROPOSALS = """
from fast_rcnn.nms_wrapper import nms
"""


def _rois(**kwargs) -> np.ndarray:
    rng = np.random.default_rng(0)
    net = caffe.Net(PROPOSAL_NET, caffe.TEST, **kwargs)
    prob = rng.uniform(size=(1, 18, 4, 4))
    net.blobs["prob"].data[...] = prob / (prob[:, :9] + prob[:, 9:]).repeat(2, 1)
    net.blobs["deltas"].data[...] = rng.normal(size=(1, 36, 4, 4)) * 0.1
    net.blobs["im_info"].data[...] = [[64, 64, 1]]
    return net.forward()["rois"]


def test_the_users_module_runs_when_it_imports(user_module):
    user_module("rpn.proposal_layer", USER_PROPOSALS)
    np.testing.assert_array_equal(_rois(), [[0, 1, 2, 3, 4]])


def test_the_built_in_runs_when_the_users_module_fails_to_import(user_module, caplog):
    user_module("rpn.proposal_layer", BROKEN_PROPOSALS)
    with caplog.at_level(logging.WARNING, logger="caffe2jax"):
        rois = _rois()
    assert rois.shape == (144, 5)  # the built-in: one row per anchor (4·4·9 < 300)
    assert "rpn.proposal_layer" in caplog.text and "ModuleNotFoundError" in caplog.text
    assert "fast_rcnn" in caplog.text


def test_the_api_argument_wins_over_the_variable(user_module, monkeypatch):
    user_module("rpn.proposal_layer", USER_PROPOSALS)
    assert _rois(python_layers="builtin").shape == (144, 5)
    monkeypatch.setenv("CAFFE2JAX_PYTHON_LAYERS", "builtin")
    assert _rois().shape == (144, 5)
    np.testing.assert_array_equal(_rois(python_layers="user"), [[0, 1, 2, 3, 4]])
    monkeypatch.setenv("CAFFE2JAX_PYTHON_LAYERS", "auto")
    with caffe.python_layers("builtin"):
        assert _rois().shape == (144, 5)


def test_user_never_takes_the_built_in_and_bad_choices_are_named(user_module, monkeypatch):
    user_module("rpn.proposal_layer", BROKEN_PROPOSALS)
    with pytest.raises(ModuleNotFoundError, match="fast_rcnn"):
        _rois(python_layers="user")
    with pytest.raises(NetError, match="python_layers: 'mine' is not one of auto, builtin, user"):
        _rois(python_layers="mine")
    monkeypatch.setenv("CAFFE2JAX_PYTHON_LAYERS", "yes")
    with pytest.raises(NetError, match="CAFFE2JAX_PYTHON_LAYERS: 'yes'"):
        _rois()
