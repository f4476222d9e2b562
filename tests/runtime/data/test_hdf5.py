"""HDF5Data against real Caffe's golden batches and its test data; HDF5Output sink."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from google.protobuf import text_format

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.readers.hdf5_data import make_sink
from caffe2jax.runtime.data.sources import make_source
from tests.golden import GOLDEN, TEST_DATA, load_npz, require

from .helpers import layer


def _hdf5_layer(source, batch, tops=("data", "label"), extra=""):
    top_text = " ".join(f'top: "{t}"' for t in tops)
    return layer(
        f'name: "h5" type: "HDF5Data" {top_text} '
        f'hdf5_data_param {{ source: "{source}" batch_size: {batch} {extra} }}'
    )


def test_golden_batches_across_two_files():
    arrays, meta = load_npz(GOLDEN / "formats" / "hdf5_data.npz")
    assert "batches wrap across files and back to the first file" in meta["notes"]
    folder = require(GOLDEN / "formats" / "hdf5_data")
    net = text_format.Parse((folder / "net.prototxt").read_text(), caffe_pb2.NetParameter())
    source = make_source(net.layer[0], "TRAIN", base_dir=folder)
    assert source.top_shapes() == [(3, 2, 3), (3,)]
    for data, label in zip(arrays["out__data"], arrays["out__label"], strict=True):
        out_data, out_label = source.next_batch()
        assert np.array_equal(out_data, data)
        assert np.array_equal(out_label, label)
    # The recorded files are what the layer read.
    with h5py.File(folder / "part2.h5") as part2:
        assert np.array_equal(part2["label"][()], arrays["file2__label"])


def test_caffe_sample_data_list(tmp_path):
    # Caffe's own list names files relative to the Caffe root; stand one up under base_dir.
    (tmp_path / "src" / "caffe" / "test").mkdir(parents=True)
    (tmp_path / "src" / "caffe" / "test" / "test_data").symlink_to(require(TEST_DATA))
    listfile = TEST_DATA / "sample_data_list.txt"
    source = make_source(
        _hdf5_layer(listfile, 5, ("data", "label", "label2")), "TEST", base_dir=tmp_path
    )
    assert source.top_shapes() == [(5, 8, 6, 5), (5, 1), (5, 1)]
    expected = {}
    for name in ("data", "label", "label2"):
        parts = []
        for file in ("sample_data.h5", "sample_data_2_gzip.h5"):
            with h5py.File(TEST_DATA / file) as handle:
                parts.append(handle[name][()].astype(np.float32))  # uint8 labels become float
        expected[name] = np.concatenate(parts)
    for step in range(6):  # 20 rows in batches of 5: wraps after 4 batches
        rows = np.arange(step * 5, step * 5 + 5) % 20
        batch = source.next_batch()
        for name, out in zip(("data", "label", "label2"), batch, strict=True):
            assert out.dtype == np.float32
            assert np.array_equal(out, expected[name][rows]), (step, name)


def _row_files(tmp_path, sizes):
    """Files whose 'id' dataset numbers every row globally: file k holds its own range."""
    names, start = [], 0
    for k, size in enumerate(sizes):
        with h5py.File(tmp_path / f"f{k}.h5", "w") as handle:
            handle["id"] = np.arange(start, start + size, dtype=np.int32)
        names.append(f"f{k}.h5")
        start += size
    (tmp_path / "list.txt").write_text("  ".join(names) + "\n")  # any whitespace separates
    return tmp_path / "list.txt"


def test_shuffle_permutes_files_and_rows_per_pass(tmp_path):
    listfile = _row_files(tmp_path, [4, 3, 5])
    text = _hdf5_layer(listfile, 12, ("id",), "shuffle: true")
    source = make_source(text, "TRAIN", base_dir=tmp_path, seed=5)
    bounds = {range(0, 4), range(4, 7), range(7, 12)}
    passes = [source.next_batch()[0].astype(int) for _ in range(6)]
    for ids in passes:
        assert sorted(ids) == list(range(12))
        runs, position = [], 0
        while position < 12:  # every file is read whole before the next one
            home = next(r for r in bounds if ids[position] in r)
            runs.append(home)
            assert sorted(ids[position : position + len(home)]) == list(home)
            position += len(home)
        assert set(runs) == bounds
    assert len({tuple(p) for p in passes}) > 1
    again = make_source(text, "TRAIN", base_dir=tmp_path, seed=5)
    assert np.array_equal(again.next_batch()[0], passes[0])


def test_single_file_is_reshuffled_each_pass(tmp_path):
    listfile = _row_files(tmp_path, [6])
    text = _hdf5_layer(listfile, 6, ("id",), "shuffle: true")
    source = make_source(text, "TRAIN", base_dir=tmp_path, seed=0)
    passes = {tuple(source.next_batch()[0].astype(int)) for _ in range(8)}
    assert all(sorted(p) == list(range(6)) for p in passes) and len(passes) > 1


def test_hdf5_errors(tmp_path):
    listfile = _row_files(tmp_path, [3, 2])
    with pytest.raises(DataError, match=r"f0.h5: no dataset 'nope' \(named by a top\)"):
        make_source(_hdf5_layer(listfile, 2, ("id", "nope")), "TRAIN", base_dir=tmp_path)
    transformed = _hdf5_layer(listfile, 2, ("id",))
    transformed.transform_param.scale = 2
    with pytest.raises(DataError, match="HDF5Data does not transform data"):
        make_source(transformed, "TRAIN", base_dir=tmp_path)
    with h5py.File(tmp_path / "uneven.h5", "w") as handle:
        handle["a"], handle["b"] = np.zeros(3), np.zeros(4)
    (tmp_path / "uneven.txt").write_text("uneven.h5\n")
    with pytest.raises(DataError, match="need the same, non-zero number of rows"):
        make_source(_hdf5_layer(tmp_path / "uneven.txt", 1, ("a", "b")), "TRAIN", base_dir=tmp_path)
    (tmp_path / "missing.txt").write_text("nowhere.h5\n")
    with pytest.raises(DataError, match="missing.txt: HDF5 file not found: nowhere.h5"):
        make_source(_hdf5_layer(tmp_path / "missing.txt", 1, ("a",)), "TRAIN", base_dir=tmp_path)
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(DataError, match="must list at least 1 HDF5 file"):
        make_source(_hdf5_layer(tmp_path / "empty.txt", 1, ("a",)), "TRAIN")


def test_hdf5_output_writes_caffe_layout_and_appends(tmp_path):
    sink_layer = layer(
        'name: "out" type: "HDF5Output" bottom: "feat" bottom: "y" '
        'hdf5_output_param { file_name: "out.h5" }'
    )
    (tmp_path / "out.h5").write_bytes(b"old contents")  # truncated, as Caffe's H5F_ACC_TRUNC
    with make_sink(sink_layer, out_dir=tmp_path) as sink:
        sink.write([np.ones((2, 3), np.float32), np.array([1, 2], np.float32)])
        sink.write([np.zeros((1, 3), np.float32), np.array([3], np.float32)])
    with h5py.File(tmp_path / "out.h5") as handle:
        assert sorted(handle) == ["data", "label"]  # Caffe's names, whatever the bottoms
        assert handle["data"].shape == (3, 3, 1, 1)  # legacy 4-D (num, channels, 1, 1)
        assert handle["label"][()].ravel().tolist() == [1, 2, 3]
    (tmp_path / "out.txt").write_text("out.h5\n")
    back = make_source(_hdf5_layer(tmp_path / "out.txt", 3), "TEST", base_dir=tmp_path)
    back = back.next_batch()
    assert back[0][:, :, 0, 0].tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 0]]
    with make_sink(sink_layer, out_dir=tmp_path) as sink:
        with pytest.raises(DataError, match="same batch size"):
            sink.write([np.ones((2, 3)), np.ones(3)])
        with pytest.raises(DataError, match="writes 2 blobs"):
            sink.write([np.ones((2, 3))])


def test_hdf5_output_is_written_atomically(tmp_path):
    sink_layer = layer(
        'name: "out" type: "HDF5Output" bottom: "feat" bottom: "y" '
        'hdf5_output_param { file_name: "out.h5" }'
    )
    (tmp_path / "out.h5").write_bytes(b"an earlier run's file")
    sink = make_sink(sink_layer, out_dir=tmp_path)
    sink.write([np.ones((2, 3), np.float32), np.array([1, 2], np.float32)])
    # until the sink closes, the earlier file is intact and the new one is a hidden temp file
    assert (tmp_path / "out.h5").read_bytes() == b"an earlier run's file"
    assert len(list(tmp_path.glob(".out.h5.*.tmp"))) == 1
    sink.close()
    sink.close()  # idempotent
    assert not list(tmp_path.glob(".out.h5.*.tmp"))
    with h5py.File(tmp_path / "out.h5") as handle:
        assert handle["data"].shape == (2, 3, 1, 1)
