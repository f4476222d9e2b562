"""Data and ImageData sources: shapes, order, wrap-around, rand_skip, shuffle, resize, gray,
MyCaffe's label balancing and boosting, and clear errors on bad data."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.records.datum import array_to_datum, encoded_datum
from caffe2jax.runtime.data.records.db import Writer
from caffe2jax.runtime.data.sources import make_source
from caffe2jax.runtime.data.transform.image import encode_image

from .helpers import data_layer, layer, numbered_items, write_db


def _firsts(batch: list[np.ndarray]) -> list[int]:
    """The index each item of a numbered batch came from."""
    return [int(v) for v in batch[0][:, 0, 0, 0]]


def test_data_shapes_order_and_wrap_around(tmp_path):
    db = write_db(tmp_path / "db", numbered_items(6), [10, 11, 12, 13, 14, 15])
    source = make_source(layer(data_layer(db, 4, transform="scale: 2")), "TRAIN", seed=0)
    assert source.top_shapes() == [(4, 1, 2, 2), (4,)]
    batches = [source.next_batch() for _ in range(3)]
    assert [_firsts(b) for b in batches] == [[0, 2, 4, 6], [8, 10, 0, 2], [4, 6, 8, 10]]
    assert batches[1][1].tolist() == [14, 15, 10, 11]
    assert batches[0][0].dtype == np.float32 and batches[0][1].dtype == np.float32
    assert [a.shape for a in batches[0]] == source.top_shapes()
    source.close()


def test_data_with_one_top_and_crop(tmp_path):
    db = write_db(tmp_path / "db", numbered_items(3, (2, 5, 5)), [0, 1, 2])
    text = data_layer(db, 2, transform="crop_size: 3").replace(' top: "label"', "")
    source = make_source(layer(text), "TEST")
    assert source.top_shapes() == [(2, 2, 3, 3)]
    [data] = source.next_batch()
    assert data.shape == (2, 2, 3, 3)


def test_rand_skip_in_train_only(tmp_path):
    db = write_db(tmp_path / "db", numbered_items(8), list(range(8)))
    text = layer(data_layer(db, 1, extra="rand_skip: 5"))
    starts = {_firsts(make_source(text, "TRAIN", seed=s).next_batch())[0] for s in range(40)}
    assert starts == {0, 1, 2, 3, 4}  # Rand(rand_skip) records skipped once
    tests = {_firsts(make_source(text, "TEST", seed=s).next_batch())[0] for s in range(5)}
    assert tests == {0}  # a TEST source reads from the start


def test_relative_source_tries_cwd_then_base_dir(tmp_path, monkeypatch):
    write_db(tmp_path / "net" / "db", numbered_items(2), [0, 1]) if (
        tmp_path / "net"
    ).mkdir() is None else None
    text = layer(data_layer("db", 1))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        DataError, match=r"data_param.source not found: db \(looked in the working directory or in"
    ):
        make_source(text, "TEST", base_dir=tmp_path / "elsewhere")
    assert _firsts(make_source(text, "TEST", base_dir=tmp_path / "net").next_batch()) == [0]
    write_db(tmp_path / "db", [np.full((1, 2, 2), 7, np.uint8)], [0])  # now in the cwd too
    assert _firsts(make_source(text, "TEST", base_dir=tmp_path / "net").next_batch()) == [7]


def test_corrupt_record_names_the_database_and_key(tmp_path):
    with Writer(tmp_path / "db") as writer:
        writer.put("00000000_a", array_to_datum(np.zeros((1, 2, 2), np.uint8)).SerializeToString())
        writer.put("00000001_b", b"\x08\x96\x01\xff\xff")
    source = make_source(layer(data_layer(tmp_path / "db", 2)), "TRAIN")
    with pytest.raises(DataError, match=r"db: record '00000001_b': corrupt Datum"):
        source.next_batch()


def test_record_of_another_shape_is_refused(tmp_path):
    items = [np.zeros((1, 2, 2), np.uint8), np.zeros((1, 3, 3), np.uint8)]
    source = make_source(layer(data_layer(write_db(tmp_path / "db", items, [0, 1]), 2)), "TRAIN")
    with pytest.raises(DataError, match=r"record '00000001_item1': shape \(1, 3, 3\) differs"):
        source.next_batch()


def test_encoded_and_float_records(tmp_path):
    bgr = np.stack([np.full((4, 4), v, np.uint8) for v in (10, 20, 30)])
    with Writer(tmp_path / "enc") as writer:
        writer.put("00000000_x.png", encoded_datum(encode_image(bgr, "png"), 3).SerializeToString())
    native = make_source(layer(data_layer(tmp_path / "enc", 1)), "TEST")
    assert native.top_shapes() == [(1, 3, 4, 4), (1,)]
    assert native.next_batch()[0][0, :, 0, 0].tolist() == [10, 20, 30]  # BGR kept
    gray = make_source(layer(data_layer(tmp_path / "enc", 1, transform="force_gray: true")), "TEST")
    assert gray.top_shapes() == [(1, 1, 4, 4), (1,)]
    floats = [np.full((1, 1, 2), 0.25, np.float32)]
    db = write_db(tmp_path / "f", floats, [1])
    out = make_source(layer(data_layer(db, 1, transform="scale: 4")), "TEST").next_batch()
    assert out[0].tolist() == [[[[1.0, 1.0]]]]


def test_bad_data_layers(tmp_path):
    db = write_db(tmp_path / "db", numbered_items(2), [0, 1])
    with pytest.raises(DataError, match="batch_size must be positive"):
        make_source(layer(data_layer(db, 0)), "TRAIN")
    with pytest.raises(DataError, match="is an LMDB but the backend is LEVELDB"):
        make_source(layer(data_layer(db, 1).replace("backend: LMDB", "")), "TRAIN")
    window = layer(
        'name: "w" type: "WindowData" top: "data" top: "label" '
        "transform_param { crop_size: 4 } window_data_param { batch_size: 2 }"
    )
    with pytest.raises(DataError, match="window_data_param.source: no path given"):
        make_source(window, "TRAIN")
    with pytest.raises(DataError, match="HDF5Output is a sink"):
        make_source(layer('name: "o" type: "HDF5Output" bottom: "a" bottom: "b"'), "TRAIN")
    with pytest.raises(DataError, match="'Convolution' is not a data layer"):
        make_source(layer('name: "c" type: "Convolution"'), "TRAIN")


def _boost_db(path, labels, boosts):
    with Writer(path) as writer:
        for i, (label, boost) in enumerate(zip(labels, boosts, strict=True)):
            datum = array_to_datum(np.full((1, 1, 1), i % 256, np.uint8), label, boost=boost)
            writer.put(f"{i:08d}", datum.SerializeToString())
    return path


def test_mycaffe_label_balancing(tmp_path):
    db = _boost_db(tmp_path / "db", [0] * 90 + [1] * 10, [0] * 100)
    source = make_source(
        layer(data_layer(db, 500, extra="enable_label_balancing: true")), "TRAIN", seed=1
    )
    labels = np.concatenate([source.next_batch()[1] for _ in range(4)])
    assert 0.45 < labels.mean() < 0.55  # one label in ten, drawn half of the time


def test_mycaffe_image_boosting(tmp_path):
    boosts = [1 if i < 5 else 0 for i in range(100)]
    db = _boost_db(tmp_path / "db", [0] * 100, boosts)
    source = make_source(
        layer(data_layer(db, 1000, extra="super_boost_probability: 0.5")), "TRAIN", seed=2
    )
    picks = source.next_batch()[0][:, 0, 0, 0]
    share = np.isin(picks, np.arange(5)).mean()
    assert 0.48 < share < 0.57  # 0.5 from boosted draws + 0.5 × 5 % from ordinary ones
    assert set(np.unique(picks[np.isin(picks, np.arange(5))])) == set(range(5))


def _png(path, value, size=(4, 6), mode="RGB"):
    path.parent.mkdir(parents=True, exist_ok=True)
    array = np.zeros((*size, 3), np.uint8) + np.array(value, np.uint8)
    Image.fromarray(array if mode == "RGB" else array[..., 0], mode=mode).save(path)


def _image_layer(listfile, batch, extra=""):
    return layer(
        f'name: "img" type: "ImageData" top: "data" top: "label" '
        f'image_data_param {{ source: "{listfile}" batch_size: {batch} {extra} }}'
    )


def _image_set(tmp_path, count=5):
    lines = []
    for i in range(count):
        _png(tmp_path / "imgs" / f"im {i}.png", (i, 100 + i, 200 + i))  # RGB
        lines.append(f"im {i}.png {i}")  # a path with a space: the label follows the last one
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n\n")
    return tmp_path / "list.txt"


def test_image_data_reads_bgr_in_order_with_root_folder(tmp_path):
    listfile = _image_set(tmp_path)
    source = make_source(_image_layer(listfile, 3, f'root_folder: "{tmp_path}/imgs/"'), "TEST")
    assert source.top_shapes() == [(3, 3, 4, 6), (3,)]
    data, labels = source.next_batch()
    assert data[:, :, 0, 0].tolist() == [[200 + i, 100 + i, i] for i in range(3)]
    assert labels.tolist() == [0, 1, 2]
    assert source.next_batch()[1].tolist() == [3, 4, 0]  # wraps around


def test_image_data_reshuffles_every_epoch(tmp_path):
    listfile = _image_set(tmp_path, 6)
    text = _image_layer(listfile, 6, f'shuffle: true root_folder: "{tmp_path}/imgs/"')
    source = make_source(text, "TRAIN", seed=4)
    epochs = [tuple(source.next_batch()[1].astype(int)) for _ in range(5)]
    assert all(sorted(e) == list(range(6)) for e in epochs)
    assert len(set(epochs)) > 1
    again = make_source(text, "TRAIN", seed=4)
    assert tuple(again.next_batch()[1].astype(int)) == epochs[0]


def test_image_data_resize_and_gray(tmp_path):
    listfile = _image_set(tmp_path, 2)
    extra = f'new_height: 8 new_width: 3 is_color: false root_folder: "{tmp_path}/imgs/"'
    source = make_source(_image_layer(listfile, 2, extra), "TRAIN")
    assert source.top_shapes() == [(2, 1, 8, 3), (2,)]
    data, _ = source.next_batch()
    # gray of RGB (1, 101, 201): (9798·1 + 19235·101 + 3735·201 + 2^14) >> 15
    assert np.all(data[1] == (9798 * 1 + 19235 * 101 + 3735 * 201 + (1 << 14)) >> 15)
    with pytest.raises(DataError, match="new_height and new_width must be set at the same time"):
        make_source(_image_layer(listfile, 1, "new_height: 8"), "TRAIN")


def test_image_data_rand_skip_and_errors(tmp_path):
    listfile = _image_set(tmp_path, 3)
    root = f'root_folder: "{tmp_path}/imgs/"'
    starts = {
        int(
            make_source(
                _image_layer(listfile, 1, f"rand_skip: 3 {root}"), "TEST", seed=s
            ).next_batch()[1][0]
        )
        for s in range(30)
    }
    assert starts == {0, 1, 2}
    with pytest.raises(DataError, match=r"list.txt:1: image not found: im 0.png"):
        make_source(_image_layer(listfile, 1), "TRAIN")  # no root_folder
    (tmp_path / "bad.txt").write_text("im 0.png 0\nim 1.png\n")
    with pytest.raises(DataError, match=r"bad.txt:2: expected 'path label', got 'im 1.png'"):
        make_source(_image_layer(tmp_path / "bad.txt", 1, root), "TRAIN")
    _png(tmp_path / "imgs" / "big.png", (0, 0, 0), size=(5, 5))
    (tmp_path / "mixed.txt").write_text("im 0.png 0\nbig.png 1\n")
    mixed = make_source(_image_layer(tmp_path / "mixed.txt", 2, root), "TRAIN")
    with pytest.raises(DataError, match=r"mixed.txt:2: image big.png has shape \(3, 5, 5\)"):
        mixed.next_batch()
    (tmp_path / "imgs" / "broken.png").write_bytes(b"\x89PNG broken")
    (tmp_path / "broken.txt").write_text("im 0.png 0\nbroken.png 1\n")
    broken = make_source(_image_layer(tmp_path / "broken.txt", 2, root), "TRAIN")
    with pytest.raises(DataError, match=r"broken.png: could not decode image"):
        broken.next_batch()


def test_phase_enum_values_and_deprecated_fields(tmp_path, caplog):
    db = write_db(tmp_path / "db", numbered_items(4), list(range(4)))
    text = layer(data_layer(db, 1, extra="rand_skip: 3 scale: 0.5"))
    with caplog.at_level("WARNING"):
        source = make_source(text, caffe_pb2.TEST, seed=1)
    assert "data_param.scale ignored" in caplog.text
    assert _firsts(source.next_batch()) == [0]  # TEST: no rand_skip, and no scale applied
    with pytest.raises(ValueError, match="phase must be"):
        make_source(text, "VALIDATE")


def test_a_batch_past_int_max_is_refused_before_it_is_planned(tmp_path):
    # batch_size 2^31 - 1 over a small database: one line before any record is listed (the
    # plan of such a batch was a list of 2^31 records, a hang)
    db = write_db(tmp_path / "db", numbered_items(3), [0, 1, 2])
    source = make_source(layer(data_layer(db, 2**31 - 1)), "TRAIN")
    try:
        with pytest.raises(DataError, match=r"^layer 'd': top '#0' \[2147483647, 1, 2, 2\] holds"):
            source.next_batch()
    finally:
        source.close()
