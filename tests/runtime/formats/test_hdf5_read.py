"""The checked HDF5 reader: sizes validated before allocating, links refused, one-line errors
naming file, layer and blob (weights, solver states, convert-weights, HDF5Data)."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import MAX_MESSAGE, DataError, WeightsError
from caffe2jax.lowering.model import compile as compile_net
from caffe2jax.runtime.data.readers.hdf5_data import load_hdf5_tops
from caffe2jax.runtime.formats.convert import convert_weights
from caffe2jax.runtime.formats.solverstate import read_solverstate
from caffe2jax.runtime.formats.weights import load_weights
from tests.golden import GOLDEN, require

FORMATS = GOLDEN / "formats"


@pytest.fixture(scope="module")
def model():
    return compile_net(require(FORMATS / "format_net.prototxt"))


def _weights(tmp_path, edit):
    path = tmp_path / "w.caffemodel.h5"
    shutil.copy(require(FORMATS / "format_net.caffemodel.h5"), path)
    with h5py.File(path, "r+") as f:
        del f["data/conv1/0"]
        edit(f["data/conv1"])
    return path


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text and len(text) <= MAX_MESSAGE, text
    return text


def test_declared_size_is_checked_before_allocating(tmp_path, model):
    path = _weights(tmp_path, lambda g: g.create_dataset("0", shape=(10**11,), dtype="f4"))
    assert path.stat().st_size < 64 * 1024  # a small file declaring 373 GiB
    with pytest.raises(WeightsError) as err:
        load_weights(path, model)
    assert "layer 'conv1' blob 0" in _one_line(err) and "declares shape [100000000000]" in str(
        err.value
    )
    with pytest.raises(WeightsError, match=r"declares shape \[100000000000\]"):  # no net
        convert_weights(path, tmp_path / "out.caffemodel")
    assert not (tmp_path / "out.caffemodel").exists()


def test_compression_bomb_is_refused(tmp_path):
    def bomb(group):
        ds = group.create_dataset("0", shape=(4096, 1024), dtype="f4", chunks=(256, 1024),
                                  compression="gzip", compression_opts=9)  # fmt: skip
        ds[...] = 0.0

    path = _weights(tmp_path, bomb)
    with pytest.raises(WeightsError) as err:
        convert_weights(path, tmp_path / "out.caffemodel.h5")
    assert "refusing to expand it" in _one_line(err)
    assert not (tmp_path / "out.caffemodel.h5").exists()


@pytest.mark.parametrize(
    "link, kind",
    [
        (h5py.SoftLink("/data/conv1"), "a soft"),
        (h5py.SoftLink("/data"), "a soft"),
        (h5py.ExternalLink("/etc/passwd", "/"), "an external"),
    ],
)
def test_links_are_not_followed(tmp_path, model, link, kind):
    path = _weights(tmp_path, lambda g: g.__setitem__("0", link))
    with pytest.raises(WeightsError) as err:
        load_weights(path, model)
    assert f"/data/conv1/0 is {kind} link" in _one_line(err)


def test_external_storage_and_odd_dtypes(tmp_path, model):
    path = _weights(
        tmp_path,
        lambda g: g.create_dataset("0", shape=(4,), dtype="f4", external=[("/etc/passwd", 0, 16)]),
    )
    with pytest.raises(WeightsError, match="keeps its data in other files"):
        load_weights(path, model)
    path = _weights(tmp_path, lambda g: g.create_dataset("0", data=np.bytes_(b"\xff\xfe")))
    with pytest.raises(WeightsError, match=r"layer 'conv1' blob 0 holds \|S2, not numbers"):
        load_weights(path, model)


def test_corrupt_hdf5_is_one_line(tmp_path, model):
    data = bytearray(require(FORMATS / "format_net.caffemodel.h5").read_bytes())
    path = tmp_path / "w.caffemodel.h5"
    seen = set()
    for offset in range(0, len(data), 97):  # every h5py error class, none escaping
        broken = bytearray(data)
        broken[offset : offset + 8] = b"\xff" * 8
        path.write_bytes(bytes(broken))
        try:
            load_weights(path, model)
        except WeightsError as err:
            assert "\n" not in str(err) and str(err).startswith(str(path))
            seen.add(str(err).split("(")[0])
    assert seen


def _solverstate(tmp_path, body: bytes):
    path = tmp_path / "s.solverstate"
    path.write_bytes(b"\x08\x05" + body)  # iter: 5
    return path


def test_binary_solverstate_errors(tmp_path):
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend([2, 3])
    blob.data.extend([1.0] * 5)
    history = blob.SerializeToString()
    path = _solverstate(tmp_path, b"\x1a" + bytes([len(history)]) + history)
    with pytest.raises(
        WeightsError, match=r"history blob 0: 5 value\(s\) stored for shape \[2, 3\]"
    ):
        read_solverstate(path)
    path = _solverstate(tmp_path, b"\x12\x03\xff\xfe\x80")  # learned_net, not UTF-8
    with pytest.raises(WeightsError):
        read_solverstate(path)


def test_hdf5_solverstate_errors(tmp_path):
    path = tmp_path / "s.solverstate.h5"
    with h5py.File(path, "w") as f:
        f["iter"] = np.array([5], "i4")
        f["learned_net"] = np.bytes_(b"\xff\xfe")
        f.create_group("history")["0"] = np.ones(3, "f4")
    with pytest.raises(WeightsError, match="learned_net is not UTF-8 text"):
        read_solverstate(path)
    with h5py.File(path, "r+") as f:
        del f["learned_net"]
        f["history/1"] = h5py.ExternalLink("/etc/passwd", "/")
    with pytest.raises(WeightsError, match="history/1 is an external link"):
        read_solverstate(path)
    with h5py.File(path, "r+") as f:
        del f["history/1"]
        f.create_dataset("history/1", shape=(10**10,), dtype="f4", chunks=True)
    with pytest.raises(WeightsError, match="history blob 1"):
        read_solverstate(path)


def test_hdf5_data_file_checked(tmp_path):
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", shape=(10**9, 100), dtype="f4", chunks=True)
        f["label"] = h5py.SoftLink("/data")
    with pytest.raises(DataError, match="/label is a soft link"):
        load_hdf5_tops(path, ["label"])
    with pytest.raises(DataError, match="dataset 'data'"):
        load_hdf5_tops(path, ["data"])
