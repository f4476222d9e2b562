"""pycaffe's Net on real Caffe's whole-net goldens, and its pycaffe behaviours.

Tolerances (DESIGN.md): activations ≤ 1e-4 and gradients ≤ 1e-3 relative: OpenBLAS sgemm
sums in another order than XLA, and the difference accumulates through the layers.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import DataError, NetError
from tests import jitted
from tests.golden import GOLDEN, load_npz, require

jax.config.update("jax_default_matmul_precision", "highest")

NETS = sorted(p.stem for p in require(GOLDEN / "nets").glob("*.npz"))


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture(scope="module", params=NETS)
def golden_net(request):
    case = request.param
    arrays, meta = load_npz(GOLDEN / "nets" / f"{case}.npz")
    net = caffe2jax.Net(
        str(GOLDEN / "nets" / f"{case}.prototxt"),
        caffe2jax.TRAIN if meta["phase"] == "TRAIN" else caffe2jax.TEST,
        weights=str(GOLDEN / "nets" / f"{case}.caffemodel"),
    )
    inputs = {k[4:]: v for k, v in arrays.items() if k.startswith("in__")}
    out = net.forward(**inputs)
    return case, arrays, meta, net, out


def test_forward_blobs(golden_net):
    case, arrays, meta, net, out = golden_net
    assert sorted(out) == sorted(meta["outputs"])
    for name in meta["stored_blobs"]:
        assert rel(net.blobs[name].data, arrays[f"blob__{name}"]) <= 1e-4, f"{case}: {name}"


def test_backward_gradients(golden_net):
    case, arrays, meta, net, _ = golden_net
    diffs = {k[9:]: v for k, v in arrays.items() if k.startswith("topdiff__")}
    grads = net.backward(**diffs)
    assert rel(grads["data"], arrays["grad__data"]) <= 1e-3, f"{case}: data diff"
    assert rel(net.blobs["data"].diff, arrays["grad__data"]) <= 1e-3
    for layer in meta["stored_param_grads"]:
        for i, blob in enumerate(net.params[layer]):
            key = f"paramgrad__{layer}__{i}"
            if key in arrays:
                assert rel(blob.diff, arrays[key]) <= 1e-3, f"{case}: {key}"


LENET = GOLDEN / "nets" / "lenet_train.prototxt"


def test_in_place_blob_names_show_the_last_writer_and_diff_of_the_first():
    """Caffe: ``blobs['ip1'].data`` is ReLU's output, ``.diff`` the diff into ReLU's input."""
    arrays, _ = load_npz(GOLDEN / "nets" / "lenet_train.npz")
    net = caffe2jax.Net(str(LENET), caffe2jax.TRAIN, weights=str(LENET.with_suffix(".caffemodel")))
    net.forward(data=arrays["in__data"], label=arrays["in__label"])
    assert np.all(net.blobs["ip1"].data >= 0)
    net.backward()
    before_relu = net.blobs["ip1"].diff
    w = net.params["ip2"][0].data
    upstream = net.blobs["ip2"].diff @ w  # d loss / d relu output
    relu_out = net.blobs["ip1"].data
    np.testing.assert_allclose(before_relu, upstream * (relu_out > 0), rtol=1e-4, atol=1e-7)


def test_forward_compiles_once_per_shape_and_reshape():
    arrays, _ = load_npz(GOLDEN / "nets" / "lenet_train.npz")
    net = caffe2jax.Net(str(LENET), caffe2jax.TRAIN)
    for _ in range(3):
        net.forward(data=arrays["in__data"], label=arrays["in__label"])
    assert forward_programs(net) == 1 and len(net.model.family()) == 1
    first = net.model
    net.blobs["data"].reshape(5, 1, 28, 28)
    net.blobs["label"].reshape(5)
    net.reshape()
    out = net.forward(data=np.zeros((5, 1, 28, 28), np.float32), label=np.zeros(5, np.float32))
    assert net.blobs["ip2"].data.shape == (5, 10) and np.isfinite(out["loss"])
    assert len(net.model.family()) == 2 and forward_programs(net) == 1
    net.forward(data=arrays["in__data"], label=arrays["in__label"])  # the first shape again
    assert net.model is first and forward_programs(net) == 1


def forward_programs(net) -> int:
    """Compiled forwards kept with the current input shapes' model."""
    return sum(1 for k in net.model.programs if k[0] == "forward")


def test_params_are_writable_and_used():
    arrays, _ = load_npz(GOLDEN / "nets" / "lenet_train.npz")
    net = caffe2jax.Net(str(LENET), caffe2jax.TRAIN)
    for blobs in net.params.values():
        for blob in blobs:
            blob.data[...] = 0
    net.forward(data=arrays["in__data"], label=arrays["in__label"])
    np.testing.assert_allclose(net.blobs["ip2"].data, 0)
    assert net.blobs["loss"].data == pytest.approx(np.log(10), rel=1e-6)


def test_save_and_copy_from_round_trip(tmp_path):
    net = caffe2jax.Net(str(LENET), caffe2jax.TRAIN, weights=str(LENET.with_suffix(".caffemodel")))
    net.save(str(tmp_path / "w.caffemodel"))
    net.save_hdf5(str(tmp_path / "w.caffemodel.h5"))
    for path in ("w.caffemodel", "w.caffemodel.h5"):
        other = caffe2jax.Net(str(LENET), caffe2jax.TRAIN)
        other.copy_from(str(tmp_path / path))
        for name, blobs in net.params.items():
            for a, b in zip(blobs, other.params[name]):
                np.testing.assert_array_equal(a.data, b.data)


MEMORY_NET = """
name: "mem"
layer { name: "data" type: "MemoryData" top: "data" top: "label"
        memory_data_param { batch_size: 2 channels: 3 height: 1 width: 1 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def test_set_input_arrays_takes_batches_in_turn_and_wraps():
    net = caffe2jax.Net(MEMORY_NET, caffe2jax.TRAIN)
    data = np.arange(18, dtype=np.float32).reshape(6, 3, 1, 1)
    labels = np.array([0, 1, 0, 1, 1, 0], np.float32)
    net.set_input_arrays(data, labels)
    for start in (0, 2, 4, 0):
        net.forward()
        np.testing.assert_array_equal(net.blobs["data"].data, data[start : start + 2])
        np.testing.assert_array_equal(net.blobs["label"].data, labels[start : start + 2])


def test_memory_data_errors():
    net = caffe2jax.Net(MEMORY_NET, caffe2jax.TRAIN)
    with pytest.raises(DataError, match="call set_input_arrays"):
        net.forward()
    with pytest.raises(DataError, match="multiple of batch_size"):
        net.set_input_arrays(np.zeros((3, 3, 1, 1), np.float32), np.zeros(3, np.float32))


def test_shared_params_are_one_blob_and_gradients_sum():
    text = """
    layer { name: "in" type: "Input" top: "a" top: "b"
            input_param { shape { dim: 2 dim: 3 } } }
    layer { name: "ip_a" type: "InnerProduct" bottom: "a" top: "ya"
            param { name: "w" } param { name: "bias" } inner_product_param { num_output: 2 } }
    layer { name: "ip_b" type: "InnerProduct" bottom: "b" top: "yb"
            param { name: "w" } param { name: "bias" } inner_product_param { num_output: 2 } }
    layer { name: "sum" type: "Eltwise" bottom: "ya" bottom: "yb" top: "y" }
    layer { name: "loss" type: "Reduction" bottom: "y" top: "loss" loss_weight: 1 }
    """
    net = caffe2jax.Net(text, caffe2jax.TRAIN)
    assert net.params["ip_a"][0] is net.params["ip_b"][0]
    a = np.ones((2, 3), np.float32)
    b = 2 * np.ones((2, 3), np.float32)
    net.forward(a=a, b=b)
    net.backward()
    # d/dW of Σ(W a + W b) over the batch: each row gets Σ_n (a_n + b_n).
    np.testing.assert_allclose(net.params["ip_a"][0].diff, np.full((2, 3), 6.0))


def test_shared_param_shape_mismatch_is_a_clear_error():
    text = """
    layer { name: "in" type: "Input" top: "a" input_param { shape { dim: 2 dim: 3 } } }
    layer { name: "ip1" type: "InnerProduct" bottom: "a" top: "y1"
            param { name: "w" } inner_product_param { num_output: 2 } }
    layer { name: "ip2" type: "InnerProduct" bottom: "a" top: "y2"
            param { name: "w" } inner_product_param { num_output: 4 } }
    """
    with pytest.raises(
        NetError, match=r"cannot share param 'w' owned by layer 'ip1'.*\[2, 3\].*\[4, 3\]"
    ):
        caffe2jax.Net(text)


def test_old_style_constructor_and_phase_names():
    net = caffe2jax.Net(str(LENET), str(LENET.with_suffix(".caffemodel")), caffe2jax.TRAIN)
    assert net.phase == "TRAIN" and "loss" in net.outputs
    with pytest.raises(caffe2jax.CaffeError, match="unknown phase"):
        caffe2jax.Net(str(LENET), 7)


def test_recurrent_state_carries_across_forwards(tmp_path):
    """Caffe's RecurrentLayer copies h_T (and c_T) into the next forward's h_0: with cont = 1
    at the first step the sequence continues; cont = 0 starts afresh."""
    text = (GOLDEN / "layers" / "lstm.prototxt").read_text()
    net = caffe2jax.Net(text)
    x = np.random.default_rng(0).standard_normal((3, 2, 4)).astype(np.float32)
    fresh = np.ones((3, 2), np.float32)
    fresh[0] = 0
    first = net.forward(x=x, cont=fresh)["h"].copy()
    continued = net.forward(x=x, cont=np.ones((3, 2), np.float32))["h"].copy()
    again = net.forward(x=x, cont=fresh)["h"].copy()
    np.testing.assert_array_equal(first, again)
    assert np.abs(continued - first).max() > 1e-3
    # The carried state is not a Caffe blob: weight files keep the LSTM's 3 blobs.
    net.save(str(tmp_path / "lstm.caffemodel"))
    from caffe2jax.frontend import caffe_pb2

    saved = caffe_pb2.NetParameter()
    saved.ParseFromString((tmp_path / "lstm.caffemodel").read_bytes())
    assert [len(layer.blobs) for layer in saved.layer if layer.name == "layer"] == [3]
    assert len(net.params["layer"]) == 3


def test_backward_uses_the_state_its_forward_ran_with():
    text = (GOLDEN / "layers" / "lstm.prototxt").read_text()
    net = caffe2jax.Net(text)
    rng = np.random.default_rng(1)
    x1, x2 = (rng.standard_normal((3, 2, 4)).astype(np.float32) for _ in range(2))
    cont = np.ones((3, 2), np.float32)
    net.forward(x=x1, cont=cont)
    params, carried = net.param_values()  # the state the second forward starts from
    net.forward(x=x2, cont=cont)
    dy = rng.standard_normal((3, 2, 5)).astype(np.float32)
    net.backward(h=dy)
    model = net.model

    def h(p, x):
        return jitted.forward(model, p, carried, {"x": x, "cont": cont})[0]["h"]

    _, vjp = jax.vjp(h, params, jax.numpy.asarray(x2))
    grad_params, grad_x = vjp(jax.numpy.asarray(dy))
    np.testing.assert_allclose(net.blobs["x"].diff, grad_x, rtol=1e-5, atol=1e-7)
    # jitted vs eager float32 summation order: a few 1e-9 differences on tiny entries
    np.testing.assert_allclose(
        net.params["layer"][0].diff, grad_params["layer"][0], rtol=1e-5, atol=1e-7
    )
