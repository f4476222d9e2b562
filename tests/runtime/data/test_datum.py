"""Datum ↔ numpy through our LMDB writer and reader; BlobProto files; image codecs."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.records.datum import (
    array_to_blobproto,
    array_to_datum,
    datum_to_array,
    encoded_datum,
    parse_datum,
    read_blobproto,
    write_blobproto,
)
from caffe2jax.runtime.data.records.db import Writer, open_db
from caffe2jax.runtime.data.transform.image import decode_image, encode_image, resize

RNG = np.random.default_rng(7)


def _roundtrip(tmp_path, datums):
    with Writer(tmp_path / "db", "lmdb") as writer:
        for i, datum in enumerate(datums):
            writer.put(f"{i:08d}_x{i}.png", datum.SerializeToString())
    db = open_db(tmp_path / "db", "lmdb")
    try:
        return [(key, parse_datum(value)) for key, value in db.items()]
    finally:
        db.close()


def _png(rgb: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="PNG")
    return out.getvalue()


def test_raw_uint8_roundtrip_through_lmdb(tmp_path):
    items = [RNG.integers(0, 256, (3, 4, 5), dtype=np.uint8) for _ in range(3)]
    back = _roundtrip(tmp_path, [array_to_datum(a, label=i + 5) for i, a in enumerate(items)])
    assert [k for k, _ in back] == [b"00000000_x0.png", b"00000001_x1.png", b"00000002_x2.png"]
    for (_, datum), item, label in zip(back, items, (5, 6, 7), strict=True):
        assert (datum.channels, datum.height, datum.width, datum.label) == (3, 4, 5, label)
        assert not datum.float_data and not datum.encoded
        out = datum_to_array(datum)
        assert out.dtype == np.uint8 and np.array_equal(out, item)


def test_float_data_roundtrip_through_lmdb(tmp_path):
    item = RNG.normal(size=(2, 3, 3)).astype(np.float32)
    [(_, datum)] = _roundtrip(tmp_path, [array_to_datum(item, label=-1)])
    assert datum.data == b"" and len(datum.float_data) == 18 and datum.label == -1
    out = datum_to_array(datum)
    assert out.dtype == np.float32 and np.array_equal(out, item)


def test_encoded_png_roundtrip_is_lossless_and_bgr(tmp_path):
    rgb = RNG.integers(0, 256, (6, 7, 3), dtype=np.uint8)
    gray = RNG.integers(0, 256, (6, 7), dtype=np.uint8)
    back = _roundtrip(tmp_path, [encoded_datum(_png(rgb), 1), encoded_datum(_png(gray), 2)])
    color, mono = (d for _, d in back)
    assert color.encoded and color.channels == 0  # Caffe's ReadFileToDatum sets no shape
    assert np.array_equal(datum_to_array(color), rgb[..., ::-1].transpose(2, 0, 1))
    assert np.array_equal(datum_to_array(mono), gray[None])  # native: gray stays 1 channel
    assert np.array_equal(datum_to_array(mono, mode="color"), np.stack([gray] * 3))
    assert datum_to_array(color, mode="gray").shape == (1, 6, 7)


def test_encoded_jpeg_roundtrip_is_close(tmp_path):
    smooth = np.linspace(0, 255, 16 * 16 * 3).reshape(16, 16, 3).astype(np.uint8)
    bgr = np.ascontiguousarray(smooth.transpose(2, 0, 1))
    [(_, datum)] = _roundtrip(tmp_path, [encoded_datum(encode_image(bgr, "jpg"), 3)])
    out = datum_to_array(datum)
    assert out.shape == (3, 16, 16) and datum.label == 3
    assert np.abs(out.astype(int) - bgr).mean() < 3


def test_uint8_data_wins_over_float_data():
    datum = array_to_datum(np.full((1, 1, 2), 9, np.uint8))
    datum.float_data.extend([1.0, 2.0])
    assert np.array_equal(datum_to_array(datum), [[[9, 9]]])


def test_corrupt_datum_names_the_record():
    with pytest.raises(DataError, match=r"db: record 'k'.*corrupt Datum"):
        parse_datum(b"\xff\xff\xff\xff", where="db: record 'k'")


def test_datum_with_wrong_data_size():
    datum = caffe_pb2.Datum(channels=1, height=2, width=2, data=b"abc")
    with pytest.raises(DataError, match="holds 3 bytes"):
        datum_to_array(datum, where="rec")


def test_undecodable_image_is_a_data_error():
    with pytest.raises(DataError, match="rec 9: could not decode"):
        datum_to_array(encoded_datum(b"not an image"), where="rec 9")


def test_blobproto_legacy_roundtrip(tmp_path):
    mean = RNG.normal(size=(1, 3, 4, 5)).astype(np.float32)
    write_blobproto(tmp_path / "mean.binaryproto", mean)
    blob = caffe_pb2.BlobProto.FromString((tmp_path / "mean.binaryproto").read_bytes())
    assert (blob.num, blob.channels, blob.height, blob.width) == (1, 3, 4, 5)
    assert not blob.HasField("shape")
    assert np.array_equal(read_blobproto(tmp_path / "mean.binaryproto"), mean)
    assert [p.name for p in tmp_path.iterdir()] == ["mean.binaryproto"]  # no temp file left


def test_blobproto_shape_form_and_double_data(tmp_path):
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    blob = array_to_blobproto(values)
    assert list(blob.shape.dim) == [2, 3] and not blob.HasField("num")
    legacy = array_to_blobproto(values, legacy=True)
    assert (legacy.num, legacy.channels, legacy.height, legacy.width) == (1, 1, 2, 3)
    double = caffe_pb2.BlobProto()
    double.shape.dim.extend([3])
    double.double_data.extend([0.5, 1.5, 2.5])
    double.data.extend([9, 9, 9])  # Caffe's FromProto prefers double_data
    (tmp_path / "d.binaryproto").write_bytes(double.SerializeToString())
    assert np.array_equal(read_blobproto(tmp_path / "d.binaryproto"), [0.5, 1.5, 2.5])


def test_blobproto_errors(tmp_path):
    bad = caffe_pb2.BlobProto(num=1, channels=1, height=2, width=2)
    bad.data.extend([1.0])
    (tmp_path / "bad.binaryproto").write_bytes(bad.SerializeToString())
    with pytest.raises(DataError, match=r"bad.binaryproto: blob of shape \(1, 1, 2, 2\)"):
        read_blobproto(tmp_path / "bad.binaryproto")
    (tmp_path / "junk.binaryproto").write_bytes(b"\xff\xff\xff")
    with pytest.raises(DataError, match="junk.binaryproto: not a BlobProto"):
        read_blobproto(tmp_path / "junk.binaryproto")
    with pytest.raises(DataError, match="missing.binaryproto: cannot read"):
        read_blobproto(tmp_path / "missing.binaryproto")


def test_decoding_matches_opencv():
    import cv2  # a dependency of caffe2jax: a missing one fails

    bgr = RNG.integers(0, 256, (9, 11, 3), dtype=np.uint8)
    png = cv2.imencode(".png", bgr)[1].tobytes()
    assert np.array_equal(decode_image(png, "color"), bgr.transpose(2, 0, 1))
    gray = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_GRAYSCALE)
    assert np.abs(decode_image(png, "gray")[0].astype(int) - gray).max() <= 1
    jpg = cv2.imencode(".jpg", bgr)[1].tobytes()
    ref = cv2.imdecode(np.frombuffer(jpg, np.uint8), cv2.IMREAD_COLOR).transpose(2, 0, 1)
    assert np.abs(decode_image(jpg, "color").astype(int) - ref).max() <= 1


def test_resize_matches_opencv_bilinear():
    import cv2  # a dependency of caffe2jax: a missing one fails

    for (h, w), (new_h, new_w) in [((8, 8), (28, 28)), ((37, 29), (16, 20)), ((64, 64), (32, 32))]:
        img = RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)
        ref = cv2.resize(img, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
        ours = resize(img.transpose(2, 0, 1), new_h, new_w).transpose(1, 2, 0)
        np.testing.assert_array_equal(ours, ref)


def test_resize_hand_computed():
    # 2 → 4 columns: source x = (dx + 0.5)/2 − 0.5 = −0.25, 0.25, 0.75, 1.25 → clamped ends.
    img = np.array([[[0, 200]]], np.uint8)
    assert resize(img, 1, 4).tolist() == [[[0, 50, 150, 200]]]
