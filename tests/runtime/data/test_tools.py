"""convert_imageset and compute_image_mean, as functions and as CLI subcommands."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from PIL import Image

from caffe2jax.cli import main as cli
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.records.datum import datum_to_array, parse_datum, read_blobproto
from caffe2jax.runtime.data.records.db import open_db
from caffe2jax.runtime.tools.imageset import compute_image_mean, convert_imageset

RNG = np.random.default_rng(11)


def _images(tmp_path, count=4, size=(5, 7), broken=True):
    """RGB PNGs, their BGR C×H×W arrays, and a list file (with an undecodable entry)."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    arrays, lines = [], []
    for i in range(count):
        rgb = RNG.integers(0, 256, (*size, 3), dtype=np.uint8)
        Image.fromarray(rgb).save(folder / f"im{i}.png")
        arrays.append(rgb[..., ::-1].transpose(2, 0, 1))
        lines.append(f"im{i}.png {i % 2}")
        if broken and i == 1:
            (folder / "broken.png").write_bytes(b"\x89PNG but not really")
            lines.append("broken.png 1")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    return f"{folder}/", tmp_path / "list.txt", arrays


def _records(db_path, backend="lmdb"):
    db = open_db(db_path, backend)
    try:
        return [(k.decode(), parse_datum(v)) for k, v in db.items()]
    finally:
        db.close()


def test_convert_skips_unreadable_images_and_mean_matches_numpy(tmp_path, caplog):
    root, listfile, arrays = _images(tmp_path)
    with caplog.at_level(logging.WARNING):
        count = convert_imageset(root, listfile, tmp_path / "db")
    assert count == 4
    assert "skipping" in caplog.text and "broken.png" in caplog.text
    records = _records(tmp_path / "db")
    # The key number is the list position, so the skipped line leaves a gap.
    assert [k for k, _ in records] == [
        "00000000_im0.png",
        "00000001_im1.png",
        "00000003_im2.png",
        "00000004_im3.png",
    ]
    for (_, datum), array, label in zip(records, arrays, (0, 1, 0, 1), strict=True):
        assert datum.label == label and not datum.encoded
        assert np.array_equal(datum_to_array(datum), array)
    mean = compute_image_mean(tmp_path / "db", tmp_path / "mean.binaryproto")
    expected = (np.sum(arrays, axis=0).astype(np.float32) / np.float32(4))[None]
    assert mean.shape == (1, 3, 5, 7) and np.array_equal(mean, expected)
    assert np.allclose(mean, np.mean(arrays, axis=0)[None])
    assert np.array_equal(read_blobproto(tmp_path / "mean.binaryproto"), expected)


def test_gray_resize_and_shuffle(tmp_path):
    root, listfile, _ = _images(tmp_path, count=6, broken=False)
    convert_imageset(
        root,
        listfile,
        tmp_path / "a",
        gray=True,
        resize_height=4,
        resize_width=3,
        shuffle=True,
        seed=1,
    )
    convert_imageset(root, listfile, tmp_path / "b", shuffle=True, seed=1)
    first, second = _records(tmp_path / "a"), _records(tmp_path / "b")
    assert all(datum_to_array(d).shape == (1, 4, 3) for _, d in first)
    names = [k.split("_", 1)[1] for k, _ in first]
    assert names == [k.split("_", 1)[1] for k, _ in second]  # same seed, same order
    assert sorted(names) == [f"im{i}.png" for i in range(6)] and names != sorted(names)


def test_encoded_records(tmp_path):
    root, listfile, arrays = _images(tmp_path, count=2, broken=False)
    convert_imageset(root, listfile, tmp_path / "png", encoded=True)
    for (_, datum), i in zip(_records(tmp_path / "png"), range(2), strict=True):
        assert datum.encoded and datum.data == (tmp_path / "imgs" / f"im{i}.png").read_bytes()
        assert np.array_equal(datum_to_array(datum), arrays[i])
    convert_imageset(
        root, listfile, tmp_path / "small", encoded=True, resize_height=2, resize_width=2
    )
    assert datum_to_array(_records(tmp_path / "small")[0][1]).shape == (3, 2, 2)
    convert_imageset(root, listfile, tmp_path / "jpg", encoded=True, encode_type="jpg")
    jpeg = _records(tmp_path / "jpg")[0][1]
    assert jpeg.data[:2] == b"\xff\xd8"  # re-encoded: extension and encoding differ
    mean = compute_image_mean(tmp_path / "png")  # encoded records are decoded natively
    assert np.array_equal(mean[0], (arrays[0].astype(np.float32) + arrays[1]) / np.float32(2))


def test_check_size_and_no_partial_database(tmp_path):
    root, listfile, _ = _images(tmp_path, count=2, broken=False)
    Image.new("RGB", (3, 3)).save(tmp_path / "imgs" / "odd.png")
    with listfile.open("a") as handle:
        handle.write("odd.png 0\n")
    with pytest.raises(
        DataError, match=r"list.txt:3: odd.png has 27 bytes of data, the first image 105"
    ):
        convert_imageset(root, listfile, tmp_path / "db", check_size=True)
    assert not (tmp_path / "db").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".db")] == []


def test_leveldb_backend(tmp_path):
    pytest.importorskip("plyvel")
    root, listfile, arrays = _images(tmp_path, count=2, broken=False)
    convert_imageset(root, listfile, tmp_path / "ldb", backend="leveldb")
    mean = compute_image_mean(tmp_path / "ldb", backend="leveldb")
    assert np.allclose(mean[0], np.mean(arrays, axis=0))


def test_empty_database_has_no_mean(tmp_path):
    (tmp_path / "list.txt").write_text("missing.png 0\n")
    assert convert_imageset(f"{tmp_path}/", tmp_path / "list.txt", tmp_path / "db") == 0
    with pytest.raises(DataError, match="database is empty"):
        compute_image_mean(tmp_path / "db")


@pytest.fixture
def run_cli(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", ["convert_imageset", "compute_image_mean"])
    return cli.main


def test_cli_converts_with_caffe_style_flags_and_refuses_to_overwrite(tmp_path, run_cli, capsys):
    root, listfile, arrays = _images(tmp_path, count=3, broken=False)
    db = str(tmp_path / "db")
    args = ["convert_imageset", root, str(listfile), db, "-resize_height=4", "--resize_width", "4"]
    assert run_cli([*args, "--gray=true"]) == 0
    assert "Wrote 3 records" in capsys.readouterr().out
    assert datum_to_array(_records(db)[0][1]).shape == (1, 4, 4)
    before = (tmp_path / "db" / "data.mdb").read_bytes()
    assert run_cli(args) == 1
    err = capsys.readouterr().err
    assert "convert_imageset: error:" in err and "already exists: refusing to overwrite" in err
    assert (tmp_path / "db" / "data.mdb").read_bytes() == before
    out = str(tmp_path / "mean.binaryproto")
    assert run_cli(["compute_image_mean", db, out]) == 0
    assert read_blobproto(out).shape == (1, 1, 4, 4)
    assert run_cli(["compute_image_mean", db, out]) == 1  # an existing OUT needs --force
    assert "already exists; pass --force" in capsys.readouterr().err
    assert run_cli(["compute_image_mean", str(tmp_path / "nope"), out, "--force"]) == 1
    assert "no such lmdb database" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, encoded, channels",
    [(["--encoded"], True, 3), (["--gray", "-encoded=false"], False, 1),
     (["--encoded=true", "-gray=false"], True, 3), (["--encoded=True", "--nogray"], True, 3),
     (["--encoded=0", "-gray"], False, 1), (["-encoded", "--gray"], True, 3), ([], False, 3)],
)  # fmt: skip
def test_cli_boolean_flags_as_gflags_reads_them(tmp_path, run_cli, flags, encoded, channels):
    """``--encoded ROOT LIST DB``: a bare flag is true and leaves ROOT a positional (Caffe's
    gflags booleans); ``=true|false`` and ``--noflag`` set it explicitly. (With --encoded a
    PNG is stored as its file, gray or not: Caffe's ReadImageToDatum compares the channels of
    the image it read in the mode asked for with that mode, which always agree.)"""
    root, listfile, _ = _images(tmp_path, count=2, broken=False)
    db = str(tmp_path / "db")
    assert run_cli(["convert_imageset", *flags, root, str(listfile), db]) == 0
    datum = _records(db)[0][1]
    assert datum.encoded == encoded
    assert datum_to_array(datum).shape[0] == channels
