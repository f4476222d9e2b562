"""Weights files against real Caffe's: every golden caffemodel loads, reproduces Caffe's arrays
and is written back byte for byte; round trips, legacy encodings, copy semantics, bad files."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import jax
import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import WeightsError
from caffe2jax.runtime.formats.caffemodel import caffe_layer_params
from caffe2jax.runtime.formats.weights import load_weights, save_weights, weights_format
from tests.cli_runner import run_cli
from tests.golden import GOLDEN, MODELS, load_npz, require

jax.config.update("jax_default_matmul_precision", "highest")

CAFFEMODELS = sorted(
    str(p.relative_to(GOLDEN)) for p in require(GOLDEN).rglob("*.caffemodel*") if p.is_file()
)


def prototxt_for(model_file: Path) -> Path:
    if model_file.parent.parent.name == "solvers":
        return model_file.parent / "net.prototxt"
    return model_file.with_name(model_file.name.split(".caffemodel")[0] + ".prototxt")


def file_phase(model_file: Path) -> str:
    """The phase Caffe recorded in the binary file (HDF5 snapshots: the solver's TRAIN net)."""
    if weights_format(model_file) == "hdf5":
        return "TRAIN"
    net = caffe_pb2.NetParameter()
    net.ParseFromString(model_file.read_bytes())
    return caffe_pb2.Phase.Name(net.layer[0].phase)


@functools.cache
def compiled(prototxt: str, phase: str) -> caffe2jax.Model:
    return caffe2jax.compile(prototxt, phase=phase)


def model_for(name: str) -> tuple[Path, caffe2jax.Model]:
    path = GOLDEN / name
    return path, compiled(str(prototxt_for(path)), file_phase(path))


def blob(params, state, layer: str, i: int):
    value = params.get(layer, [None] * (i + 1))[i]
    return state[layer][i] if value is None else value


def expected_blobs(path: Path) -> dict[tuple[str, int], np.ndarray]:
    """What Caffe held when it wrote ``path``, from the npz next to it."""
    if path.parent.parent.name == "solvers":
        trace, _ = load_npz(path.parent / "trace.npz")
        after = "_iter_5" in path.name
        prefix = "param__" if after else "init__"
        return {
            (key.split("__")[1], int(key.split("__")[2])): (v[4] if after else v)
            for key, v in trace.items()
            if key.startswith(prefix)
        }
    arrays, _ = load_npz(path.with_name(path.name.split(".caffemodel")[0] + ".npz"))
    out = {}
    for key, value in arrays.items():
        parts = key.split("__")
        if parts[0] == "param" and len(parts) == 2:
            out[("layer", int(parts[1]))] = value
        elif parts[0] == "param":
            out[(parts[1], int(parts[2]))] = value
    return out


@pytest.mark.parametrize("name", CAFFEMODELS)
def test_golden_caffemodel_loads_caffes_values(name):
    path, model = model_for(name)
    params, state = load_weights(path, model)
    expected = expected_blobs(path)
    decls = model.graph.decls
    if "layer" in decls:  # layer and filler cases: npz param__i covers every blob of "layer"
        owned = [j for j in range(len(decls["layer"])) if ("layer", j) not in model.graph.shared]
        assert {("layer", j) for j in owned} <= set(expected)
    else:  # nets, solvers, formats
        assert expected, name
    for (layer, i), value in expected.items():
        np.testing.assert_array_equal(np.asarray(blob(params, state, layer, i)), value)


@pytest.mark.parametrize("name", [n for n in CAFFEMODELS if n.endswith(".caffemodel")])
def test_saving_golden_weights_reproduces_caffes_bytes(name, tmp_path):
    path, model = model_for(name)
    params, state = load_weights(path, model)
    out = save_weights(tmp_path / "out.caffemodel", model, params, state)
    assert out.read_bytes() == path.read_bytes()


NETS = ["lenet_deploy", "lenet_train", "cifar10_quick_deploy", "cifar10_quick_train",
        "cifar10_full_sigmoid_bn_train"]  # fmt: skip


@pytest.mark.parametrize("case", NETS)
def test_net_forward_with_golden_weights_matches_caffe(case):
    arrays, meta = load_npz(GOLDEN / "nets" / f"{case}.npz")
    model = compiled(str(GOLDEN / "nets" / f"{case}.prototxt"), meta["phase"])
    params, state = load_weights(GOLDEN / "nets" / f"{case}.caffemodel", model)
    inputs = {name: arrays[f"in__{name}"] for name in model.inputs}
    blobs, _ = jax.jit(model.apply)(params, state, inputs)
    checked = [k for k in arrays if k.startswith("blob__")]
    assert checked
    for key in checked:
        ours, caffe = np.asarray(blobs[key[6:]], np.float64), arrays[key].astype(np.float64)
        scale = max(np.linalg.norm(caffe), 1e-30)
        assert np.linalg.norm(ours - caffe) / scale <= 1e-4, key


def test_binary_and_hdf5_formats_load_identical_arrays():
    formats = GOLDEN / "formats"
    model = compiled(str(formats / "format_net.prototxt"), "TEST")
    binary = load_weights(formats / "format_net.caffemodel", model)
    hdf5 = load_weights(formats / "format_net.caffemodel.h5", model)
    assert weights_format(formats / "format_net.caffemodel.h5") == "hdf5"
    leaves_b, tree_b = jax.tree_util.tree_flatten(binary)
    leaves_h, tree_h = jax.tree_util.tree_flatten(hdf5)
    assert tree_b == tree_h and len(leaves_b) == 10
    for a, b in zip(leaves_b, leaves_h):
        np.testing.assert_array_equal(a, b)


ROUND_TRIP = ["formats/format_net.caffemodel", "nets/cifar10_full_sigmoid_bn_train.caffemodel",
              "layers/prelu_shared.caffemodel", "layers/lstm_static.caffemodel"]  # fmt: skip


@pytest.mark.parametrize("name", ROUND_TRIP)
@pytest.mark.parametrize("suffix", [".caffemodel", ".caffemodel.h5"])
def test_round_trip_is_identical_and_byte_stable(name, suffix, tmp_path):
    path, model = model_for(name)
    params, state = model.init(7)  # not Caffe's values: our own weights go through the files
    first, second = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
    save_weights(first, model, params, state)
    save_weights(second, model, params, state)
    assert first.read_bytes() == second.read_bytes()
    again = load_weights(first, model, *load_weights(path, model))
    for a, b in zip(jax.tree_util.tree_leaves((params, state)), jax.tree_util.tree_leaves(again)):
        np.testing.assert_array_equal(a, b)
    assert jax.tree_util.tree_structure(again) == jax.tree_util.tree_structure((params, state))
    assert not list(tmp_path.glob(".*.tmp"))


def test_hdf5_layout_is_caffes(tmp_path):
    import h5py

    path, model = model_for("formats/format_net.caffemodel")
    params, state = load_weights(path, model)
    save_weights(tmp_path / "w.caffemodel.h5", model, params, state)
    with (
        h5py.File(tmp_path / "w.caffemodel.h5", "r") as ours,
        h5py.File(GOLDEN / "formats/format_net.caffemodel.h5", "r") as caffe,
    ):
        assert list(ours) == list(caffe) == ["data"]
        assert list(ours["data"]) == list(caffe["data"])
        for layer in caffe["data"]:
            assert list(ours["data"][layer]) == list(caffe["data"][layer])
            for i in caffe["data"][layer]:
                a, b = ours["data"][layer][i], caffe["data"][layer][i]
                assert a.dtype == b.dtype == np.float32
                np.testing.assert_array_equal(a[()], b[()])


# ---------------------------------------------------------------------------------------------
# Legacy encodings and Caffe's copy rules

IP_NET = """name: "ip" layer { name: "data" type: "Input" top: "x"
  input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" } } }
layer { name: "ip2" type: "InnerProduct" bottom: "y" top: "z"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }"""


def legacy_blob(values: np.ndarray, dims, *, double: bool = False) -> caffe_pb2.BlobProto:
    b = caffe_pb2.BlobProto(num=dims[0], channels=dims[1], height=dims[2], width=dims[3])
    (b.double_data if double else b.data).extend(values.ravel().tolist())
    return b


def test_v1_layers_with_legacy_dims_and_double_data(tmp_path):
    model = caffe2jax.compile(IP_NET)
    w = np.arange(12, dtype=np.float64).reshape(4, 3) / 7
    bias = np.array([0.1, 0.2, 0.3, 0.4])
    net = caffe_pb2.NetParameter(name="old")
    v1 = net.layers.add(name="ip", type=caffe_pb2.V1LayerParameter.INNER_PRODUCT)
    v1.blobs.append(legacy_blob(w, (1, 1, 4, 3), double=True))
    v1.blobs.append(legacy_blob(bias, (1, 1, 1, 4)))
    v0 = net.layers.add().layer
    v0.name, v0.type = "ip2", "innerproduct"
    v0.blobs.append(legacy_blob(np.ones(8), (1, 1, 2, 4)))
    v0.blobs.append(legacy_blob(np.zeros(2), (1, 1, 1, 2)))
    (tmp_path / "old.caffemodel").write_bytes(net.SerializeToString())
    params, _ = load_weights(tmp_path / "old.caffemodel", model)
    assert params["ip"][0].dtype == np.float32 and params["ip"][0].shape == (4, 3)
    np.testing.assert_array_equal(params["ip"][0], w.astype(np.float32))
    np.testing.assert_array_equal(params["ip"][1], bias.astype(np.float32))
    np.testing.assert_array_equal(params["ip2"][0], np.ones((2, 4), np.float32))


def test_unpacked_values_and_repeated_packed_chunks(tmp_path):
    from caffe2jax.runtime.formats.blobproto import I32, LEN, encode_varint, tag

    def field(number: int, payload: bytes) -> bytes:
        return tag(number, LEN) + encode_varint(len(payload)) + payload

    shape43 = field(7, field(1, bytes([4, 3])))
    weights = np.arange(12, dtype="<f4")
    unpacked = b"".join(tag(5, I32) + v.tobytes() for v in weights)  # one field per float
    chunks = field(5, np.arange(2, dtype="<f4").tobytes()) + field(
        5, np.arange(2, 4, dtype="<f4").tobytes()
    )
    layer = field(1, b"ip") + field(2, b"InnerProduct")
    layer += field(7, unpacked + shape43) + field(7, chunks + field(7, field(1, bytes([4]))))
    (tmp_path / "w.caffemodel").write_bytes(field(100, layer))
    params, _ = load_weights(tmp_path / "w.caffemodel", caffe2jax.compile(IP_NET))
    np.testing.assert_array_equal(params["ip"][0], weights.reshape(4, 3))
    np.testing.assert_array_equal(params["ip"][1], np.arange(4, dtype=np.float32))


def write_layers(path: Path, *layers: caffe_pb2.LayerParameter) -> Path:
    net = caffe_pb2.NetParameter(name="n")
    net.layer.extend(layers)
    path.write_bytes(net.SerializeToString())
    return path


def ip_layer(name: str, *shapes, kind: str = "InnerProduct") -> caffe_pb2.LayerParameter:
    layer = caffe_pb2.LayerParameter(name=name, type=kind)
    for shape in shapes:
        b = layer.blobs.add()
        b.shape.dim.extend(shape)
        b.data.extend(np.full(int(np.prod(shape)), 0.5).tolist())
    return layer


def test_legacy_dims_follow_blob_shape_equals(tmp_path):
    model = caffe2jax.compile(IP_NET)
    net = caffe_pb2.NetParameter()
    bad = net.layer.add(name="ip", type="InnerProduct")
    bad.blobs.append(legacy_blob(np.zeros(12), (1, 1, 12, 1)))  # count fits, dims do not
    bad.blobs.append(legacy_blob(np.zeros(4), (1, 1, 1, 4)))
    (tmp_path / "w.caffemodel").write_bytes(net.SerializeToString())
    with pytest.raises(WeightsError, match=r"'ip'.* blob 0: .*\[1, 1, 12, 1\].*\[4, 3\]"):
        load_weights(tmp_path / "w.caffemodel", model)


def test_layers_missing_from_the_file_keep_their_values_and_extra_ones_are_ignored(
    tmp_path, caplog
):
    model = caffe2jax.compile(IP_NET)
    path = write_layers(tmp_path / "w.caffemodel", ip_layer("ip", (4, 3), (4,)),
                        ip_layer("elsewhere", (9,)))  # fmt: skip
    with caplog.at_level(logging.DEBUG, logger="caffe2jax.runtime.formats.weights"):
        params, state = load_weights(path, model)
    assert "elsewhere" in caplog.text
    fresh, _ = model.init(0)
    np.testing.assert_array_equal(params["ip2"][0], fresh["ip2"][0])
    np.testing.assert_array_equal(params["ip"][0], np.full((4, 3), 0.5, np.float32))
    given = {k: [np.asarray(v) + 1 for v in vs] for k, vs in fresh.items()}
    params, _ = load_weights(path, model, given)
    np.testing.assert_array_equal(params["ip2"][1], given["ip2"][1])
    np.testing.assert_array_equal(given["ip"][0], np.asarray(fresh["ip"][0]) + 1)  # not mutated


SHARED_NET = (
    IP_NET.replace('top: "z"', 'top: "z" param { name: "w2" }')
    + """
layer { name: "ip3" type: "InnerProduct" bottom: "y" top: "u" param { name: "w2" }
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }"""
)


@pytest.mark.parametrize("suffix", [".caffemodel", ".caffemodel.h5"])
def test_shared_params_live_in_the_owner_slot(tmp_path, suffix):
    model = caffe2jax.compile(SHARED_NET)
    assert model.graph.shared == {("ip3", 0): ("ip2", 0)}
    params, state = model.init(3)
    assert params["ip3"][0] is None
    path = save_weights(tmp_path / f"w{suffix}", model, params, state)
    loaded, _ = load_weights(path, model)
    assert loaded["ip3"][0] is None
    np.testing.assert_array_equal(loaded["ip2"][0], params["ip2"][0])
    if suffix == ".caffemodel":  # Caffe writes the sharer's blob too, holding the owner's data
        net = caffe_pb2.NetParameter()
        net.ParseFromString(path.read_bytes())
        ip3 = [layer for layer in net.layer if layer.name == "ip3"][0]
        np.testing.assert_array_equal(ip3.blobs[0].data, np.ravel(params["ip2"][0]))


def test_caffe_inserts_split_layers_with_its_names():
    model = caffe2jax.compile(MODELS / "examples/mnist/lenet_train_test.prototxt", phase="TEST",
                              input_shapes={"data": (2, 1, 28, 28), "label": (2,)})  # fmt: skip
    layers = caffe_layer_params(model.net, {k: len(d) for k, d in model.graph.decls.items()})
    by_name = {param.name: param for param, _ in layers}
    assert list(by_name["label_mnist_1_split"].top) == [
        "label_mnist_1_split_0", "label_mnist_1_split_1"]  # fmt: skip
    assert list(by_name["ip2_ip2_0_split"].top) == ["ip2_ip2_0_split_0", "ip2_ip2_0_split_1"]
    assert list(by_name["accuracy"].bottom) == ["ip2_ip2_0_split_0", "label_mnist_1_split_0"]
    assert list(by_name["loss"].bottom) == ["ip2_ip2_0_split_1", "label_mnist_1_split_1"]
    assert list(by_name["loss"].loss_weight) == [1.0]
    assert all(param.phase == caffe_pb2.TEST for param, _ in layers)


# ---------------------------------------------------------------------------------------------
# Bad files: one WeightsError each


@pytest.fixture
def lenet():
    return compiled(str(GOLDEN / "nets/lenet_deploy.prototxt"), "TEST")


def test_truncated_file(tmp_path, lenet):
    data = (GOLDEN / "nets/lenet_deploy.caffemodel").read_bytes()
    (tmp_path / "cut.caffemodel").write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError, match="truncated"):
        load_weights(tmp_path / "cut.caffemodel", lenet)


@pytest.mark.parametrize(
    "content", [b"", b"\x00\x01\x02garbage", b'name: "LeNet"\nlayer { name: "x" }\n']
)
def test_not_a_netparameter(tmp_path, lenet, content):
    (tmp_path / "x.caffemodel").write_bytes(content)
    with pytest.raises(WeightsError, match="x.caffemodel"):
        load_weights(tmp_path / "x.caffemodel", lenet)


def test_wrong_shapes_name_layer_blob_and_both_shapes(lenet):
    cifar = compiled(str(GOLDEN / "nets/cifar10_quick_deploy.prototxt"), "TEST")
    with pytest.raises(WeightsError) as err:
        load_weights(GOLDEN / "nets/lenet_deploy.caffemodel", cifar)
    assert "'conv1'" in str(err.value) and "blob 0" in str(err.value)
    assert "[20, 1, 5, 5]" in str(err.value) and "[32, 3, 5, 5]" in str(err.value)


@pytest.mark.parametrize(
    "layer", [ip_layer("conv1", (20, 1, 5, 5)), ip_layer("conv1", kind="ReLU")]
)
def test_wrong_blob_count_or_layer_type(tmp_path, lenet, layer):
    path = write_layers(tmp_path / "w.caffemodel", layer)
    with pytest.raises(WeightsError, match=r"'conv1' \(type Convolution\) has 2 blob"):
        load_weights(path, lenet)


def test_missing_file_and_bad_hdf5(tmp_path, lenet):
    with pytest.raises(WeightsError, match="no such"):
        load_weights(tmp_path / "nothere.caffemodel", lenet)
    data = (GOLDEN / "formats/format_net.caffemodel.h5").read_bytes()
    (tmp_path / "cut.h5").write_bytes(data[:3000])
    with pytest.raises(WeightsError, match="cut.h5"):
        load_weights(tmp_path / "cut.h5", lenet)


def test_bad_params_write_nothing(tmp_path, lenet):
    params, state = lenet.init(0)
    params["conv1"][0] = np.zeros((3, 3))
    with pytest.raises(WeightsError, match=r"params\['conv1'\]\[0\] has shape \[3, 3\]"):
        save_weights(tmp_path / "w.caffemodel", lenet, params, state)
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------
# Large files: streamed, past protobuf's 64 MB default limit, one blob in flight at a time


def test_large_caffemodel_streams_one_blob_at_a_time(tmp_path):
    import tracemalloc

    net = IP_NET.replace("dim: 2 dim: 3", "dim: 1 dim: 5120").replace("output: 4 ", "output: 4096 ")
    model = caffe2jax.compile(net)
    weights = np.random.default_rng(0).standard_normal((4096, 5120), dtype=np.float32)
    params = {"ip": [weights, np.zeros(4096, np.float32)], "ip2": [np.ones((2, 4096)), np.ones(2)]}
    path = save_weights(tmp_path / "big.caffemodel", model, params, {})
    assert path.stat().st_size > 80 * 2**20
    tracemalloc.start()
    loaded, _ = load_weights(path, model)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1.2 * weights.nbytes  # the blob's own buffer, no parsed message beside it
    np.testing.assert_array_equal(loaded["ip"][0], weights)


# ---------------------------------------------------------------------------------------------
# The CLI


def cli(*args: str | Path):
    return run_cli("convert-weights", *args)


def test_cli_converts_both_ways(tmp_path):
    import h5py

    nets = GOLDEN / "nets"
    with_model = ["--model", nets / "lenet_deploy.prototxt"]
    result = cli(nets / "lenet_deploy.caffemodel", tmp_path / "a.caffemodel.h5", *with_model)
    assert result.returncode == 0, result.stderr
    result = cli(tmp_path / "a.caffemodel.h5", tmp_path / "b.caffemodel", *with_model)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "b.caffemodel").read_bytes() == (
        nets / "lenet_deploy.caffemodel"
    ).read_bytes()
    assert cli(nets / "lenet_deploy.caffemodel", tmp_path / "raw.h5").returncode == 0
    with h5py.File(tmp_path / "raw.h5", "r") as f:
        assert list(f["data"]) == sorted(["data", "conv1", "pool1", "conv2", "pool2", "ip1",
                                          "relu1", "ip2", "prob"])  # fmt: skip
        assert f["data/ip1/0"].shape == (500, 800)
    assert cli(tmp_path / "raw.h5", tmp_path / "raw.caffemodel").returncode == 0
    model = compiled(str(nets / "lenet_deploy.prototxt"), "TEST")
    a = load_weights(tmp_path / "raw.caffemodel", model)
    b = load_weights(nets / "lenet_deploy.caffemodel", model)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(x, y)


def test_cli_errors_are_one_line_and_write_nothing(tmp_path):
    nets = GOLDEN / "nets"
    cut = tmp_path / "cut.caffemodel"
    cut.write_bytes((nets / "lenet_deploy.caffemodel").read_bytes()[:5000])
    (tmp_path / "exists.h5").write_bytes(b"keep")
    cases = [
        (tmp_path / "nothere.caffemodel", tmp_path / "o1.h5"),
        (nets / "lenet_deploy.prototxt", tmp_path / "o2.h5"),
        (cut, tmp_path / "o3.h5"),
        (nets / "lenet_deploy.caffemodel", tmp_path / "o4.caffemodel",
         "--model", nets / "cifar10_quick_deploy.prototxt"),
        (nets / "lenet_deploy.caffemodel", tmp_path / "exists.h5"),
    ]  # fmt: skip
    for args in cases:
        result = cli(*args)
        assert result.returncode == 1, args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("caffe2jax convert-weights: error:"), lines
        assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.caffemodel", "exists.h5"]
    assert (tmp_path / "exists.h5").read_bytes() == b"keep"
