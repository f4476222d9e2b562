"""Image sizes read from headers and checked before decoding
(runtime/data/transform/image_header.py): a header claiming 100000×100000 pixels is refused with
one line naming the record or file, by both decoders, through the Data and ImageData layers and the
CLI."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.records.datum import encoded_datum
from caffe2jax.runtime.data.records.db import Writer
from caffe2jax.runtime.data.sources import make_source
from caffe2jax.runtime.data.transform import image
from caffe2jax.runtime.data.transform.image import decode_image, encode_image
from caffe2jax.runtime.data.transform.image_header import header_size, max_image_pixels

from .helpers import layer

RNG = np.random.default_rng(0)


def png_claiming(width: int, height: int) -> bytes:
    """A PNG signature and IHDR claiming ``width × height`` (no pixel data)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + chunk + struct.pack(
        ">I", zlib.crc32(chunk)) + b"\x00" * 64  # fmt: skip


def bmp_claiming(width: int, height: int) -> bytes:
    """A BITMAPINFOHEADER claiming ``width × height`` (top-down: negative height)."""
    info = struct.pack("<IiiHHIIiiII", 40, width, -height, 1, 24, 0, 0, 0, 0, 0, 0)
    return b"BM" + struct.pack("<IHHI", 54 + 16, 0, 0, 54) + info + b"\x00" * 16


def jpeg_claiming(width: int, height: int) -> bytes:
    """SOI, an APP0 segment, then a baseline SOF0 claiming ``width × height``."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x01\x22\x00" * 3
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


@pytest.fixture(params=["cv2", "pil"])
def decoder(request, monkeypatch):
    monkeypatch.setenv("CAFFE2JAX_IMAGE_DECODER", request.param)
    image._cv2.cache_clear()
    yield request.param
    image._cv2.cache_clear()


@pytest.mark.parametrize("ext", ["png", "jpg", "bmp"])
def test_header_sizes_of_real_files(ext):
    chw = RNG.integers(0, 256, (3, 13, 21), dtype=np.uint8)
    assert header_size(encode_image(chw, ext)) == (21, 13)


def test_header_sizes_of_gif_and_webp():
    from PIL import Image

    for fmt in ("GIF", "WEBP"):
        import io

        out = io.BytesIO()
        Image.fromarray(RNG.integers(0, 256, (13, 21, 3), dtype=np.uint8)).save(out, format=fmt)
        assert header_size(out.getvalue()) == (21, 13), fmt


@pytest.mark.parametrize("make", [png_claiming, bmp_claiming])
def test_a_huge_header_is_refused_before_decoding(decoder, make):
    with pytest.raises(DataError) as err:
        decode_image(make(100000, 100000), name="records/x")
    text = str(err.value)
    assert text.startswith("records/x: image header claims 100000×100000 pixels, over the limit")
    assert "\n" not in text and "DecompressionBomb" not in text


def test_jpeg_and_the_limit_from_the_environment(decoder, monkeypatch):
    with pytest.raises(DataError, match=r"claims 65535×40000 pixels"):
        decode_image(jpeg_claiming(65535, 40000), name="a.jpg")
    monkeypatch.setenv("CAFFE2JAX_MAX_IMAGE_PIXELS", "100")
    assert max_image_pixels() == 100
    with pytest.raises(DataError, match=r"b.png: image header claims 11×10 pixels, over the limit "
                       r"of 100 \(set CAFFE2JAX_MAX_IMAGE_PIXELS"):  # fmt: skip
        decode_image(encode_image(np.zeros((3, 10, 11), np.uint8), "png"), name="b.png")
    monkeypatch.setenv("CAFFE2JAX_MAX_IMAGE_PIXELS", "110")
    assert decode_image(encode_image(np.zeros((3, 10, 11), np.uint8), "png")).shape == (3, 10, 11)


def test_both_decoders_give_the_same_pixels(monkeypatch):
    """cv2 (what Caffe calls) and the Pillow fallback: the same BGR bytes for JPEG and PNG,
    in colour, natively and in gray (a PNG's gray by OpenCV's weights, within 1)."""
    chw = RNG.integers(0, 256, (3, 24, 32), dtype=np.uint8)
    out = {}
    for name in ("cv2", "pil"):
        monkeypatch.setenv("CAFFE2JAX_IMAGE_DECODER", name)
        image._cv2.cache_clear()
        assert image.decoder_name() == name
        out[name] = [decode_image(encode_image(chw, ext), mode) for ext in ("jpg", "png")
                     for mode in ("color", "native", "gray")]  # fmt: skip
    image._cv2.cache_clear()
    for ours, theirs in zip(out["cv2"], out["pil"], strict=True):
        assert ours.shape == theirs.shape
        assert np.abs(ours.astype(int) - theirs).max() <= (1 if ours.shape[0] == 1 else 0)


def test_data_and_image_data_layers_name_the_record_and_the_file(tmp_path, decoder):
    good = encode_image(RNG.integers(0, 256, (3, 8, 8), dtype=np.uint8), "png")
    with Writer(tmp_path / "db", "lmdb") as writer:
        writer.put("00000000_a.png", encoded_datum(good, 0).SerializeToString())
        writer.put(
            "00000001_b.png", encoded_datum(png_claiming(100000, 100000)).SerializeToString()
        )
    data = make_source(layer(
        f'name: "d" type: "Data" top: "data" top: "label" data_param {{ source: '
        f'"{tmp_path / "db"}" batch_size: 2 backend: LMDB }}'), "TRAIN")  # fmt: skip
    with pytest.raises(DataError, match=r"db: record '00000001_b.png': image header claims "
                       r"100000×100000"):  # fmt: skip
        data.next_batch()
    (tmp_path / "ok.png").write_bytes(good)
    (tmp_path / "bomb.bmp").write_bytes(bmp_claiming(100000, 100000))
    (tmp_path / "list.txt").write_text("ok.png 0\nbomb.bmp 1\n")
    listed = tmp_path / "list.txt"
    images = make_source(layer(
        f'name: "i" type: "ImageData" top: "data" top: "label" image_data_param {{ source: '
        f'"{listed}" root_folder: "{tmp_path}/" batch_size: 2 }}'), "TRAIN")  # fmt: skip
    with pytest.raises(DataError, match=r"bomb.bmp: image header claims 100000×100000"):
        images.next_batch()
