"""``caffe2jax convert_annoset`` (caffe2jax/cli/convert_annoset.py, runtime/tools/annoset.py):
VOC XML and txt annotations into AnnotatedDatum LMDBs, the synthetic set of
examples/detection/synthetic_boxes.py, and its errors."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from caffe2jax import cli
from caffe2jax.cli import main as cli_main
from caffe2jax.runtime.data.records.annotated_datum import decode_annotated
from caffe2jax.runtime.data.records.db import open_db
from caffe2jax.runtime.tools.annoset import convert_annoset, read_txt_boxes
from examples.detection.synthetic_boxes import make_dataset, make_image


def records(db: Path) -> list[tuple[bytes, np.ndarray, object]]:
    database = open_db(db)
    try:
        return [(k, *decode_annotated(v)) for k, v in database.items()]
    finally:
        database.close()


@pytest.fixture
def run_cli(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", ["convert_annoset"])
    return cli_main.main


def test_xml_round_trip_of_the_synthetic_set(tmp_path, run_cli, capsys):
    files = make_dataset(tmp_path, train=6, test=2, size=64, lmdb=False)
    db = tmp_path / "db"
    args = ["convert_annoset", f"{tmp_path}/", str(files["train_list"]), str(db),
            "--anno_type=detection", "-label_type=xml", f"--label_map_file={files['labelmap']}",
            "--encoded", "--encode_type=png", "--check_size"]  # fmt: skip
    assert run_cli(args) == 0
    assert "Wrote 6 records" in capsys.readouterr().out
    got = records(db)
    assert [k for k, *_ in got][:2] == [b"00000000_JPEGImages/train_0000.png",
                                         b"00000001_JPEGImages/train_0001.png"]  # fmt: skip
    rng = np.random.default_rng(7)  # make_dataset's draws, replayed
    for _key, image, boxes in got:
        pixels, pixel_boxes, labels = make_image(rng, 64)
        np.testing.assert_array_equal(image, pixels)  # PNG: lossless
        # VOC's 1-based corners over the image size, as the fork's convert_annoset stores them
        want = sorted((int(lbl), *((b + 1) / 64)) for lbl, b in zip(labels, pixel_boxes))
        have = sorted((int(lbl), *b) for lbl, b in zip(boxes.labels, boxes.boxes, strict=True))
        np.testing.assert_allclose(np.array(have), np.array(want), atol=1e-6)
        assert not boxes.difficult.any()
    # never overwrites: one line, non-zero, the database unchanged
    before = (db / "data.mdb").read_bytes()
    assert run_cli(args) == 1
    err = capsys.readouterr().err
    assert "already exists: refusing to overwrite" in err and "Traceback" not in err
    assert (db / "data.mdb").read_bytes() == before


def test_txt_labels_resize_and_difficult(tmp_path):
    image = np.full((40, 80, 3), 90, np.uint8)
    cv2.imwrite(str(tmp_path / "a.jpg"), image)
    (tmp_path / "a.txt").write_text("2 8 4 40 20\n1 0 0 80 40\n")
    (tmp_path / "list.txt").write_text("a.jpg a.txt\na.jpg missing.txt\n")
    count = convert_annoset(f"{tmp_path}/", tmp_path / "list.txt", tmp_path / "db",
                            label_type="txt", resize_height=20, resize_width=30)  # fmt: skip
    assert count == 2
    (_, img, boxes), (_, _, none) = records(tmp_path / "db")
    assert img.shape == (3, 20, 30)  # raw Datum, resized; boxes stay normalized
    np.testing.assert_allclose(boxes.boxes, [[0.1, 0.1, 0.5, 0.5], [0, 0, 1, 1]])
    np.testing.assert_array_equal(boxes.labels, [2, 1])
    assert len(none) == 0  # an annotation file that does not exist: a record without boxes
    assert len(read_txt_boxes(tmp_path / "a.txt", 40, 80)) == 2


def test_xml_difficult_min_dim_and_size_fallback(tmp_path):
    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((50, 100, 3), np.uint8))
    (tmp_path / "a.xml").write_text(
        "<annotation><object><name>cat</name><difficult>1</difficult><bndbox><xmin>10</xmin>"
        "<ymin>5</ymin><xmax>60</xmax><ymax>50</ymax></bndbox></object></annotation>")  # fmt: skip
    (tmp_path / "map.prototxt").write_text('item { name: "cat" label: 4 }')
    (tmp_path / "list.txt").write_text("a.png a.xml\n")
    convert_annoset(f"{tmp_path}/", tmp_path / "list.txt", tmp_path / "db",
                    label_map_file=tmp_path / "map.prototxt", min_dim=100)  # fmt: skip
    ((_, img, boxes),) = records(tmp_path / "db")
    assert img.shape == (3, 100, 200)
    np.testing.assert_allclose(boxes.boxes, [[0.1, 0.1, 0.6, 1.0]])  # no <size>: the image's
    assert boxes.difficult.tolist() == [True] and boxes.labels.tolist() == [4]


@pytest.mark.parametrize(
    "xml, flags, message",
    [
        ("<annotation><object><name>dog</name></object></annotation>", [],
         "unknown name 'dog' (not in the label map)"),
        ("<annotation><object><name>cat</name><bndbox><xmin>1.5</xmin></bndbox></object>"
         "</annotation>", [], "bndbox xmin: '1.5' is not an integer"),
        ("<annotation>", [], "cannot read annotation XML"),
        ("<annotation/>", ["--label_type=json"], "invalid choice: 'json'"),
        ("<annotation/>", ["--anno_type=classification"], "--anno_type=classification is not "
         "supported"),
        ("<annotation/>", ["--label_map_file=nope.prototxt"], "cannot read label map"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(tmp_path, run_cli, capsys, xml, flags, message):
    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((8, 8, 3), np.uint8))
    (tmp_path / "a.xml").write_text(xml)
    (tmp_path / "map.prototxt").write_text('item { name: "cat" label: 1 }')
    (tmp_path / "list.txt").write_text("a.png a.xml\n")
    args = ["convert_annoset", f"{tmp_path}/", str(tmp_path / "list.txt"), str(tmp_path / "db"),
            f"--label_map_file={tmp_path / 'map.prototxt'}", *flags]  # fmt: skip
    code = 2 if "invalid choice" in message else 1
    with pytest.raises(SystemExit) if code == 2 else _nothing():
        assert run_cli(args) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "db").exists()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize(
    "flags, list_text, label_text, code, message",
    [
        (["--min_dim=100000"], "a.png a.txt\n", "", 1, "(or --min_dim²) is more than"),
        (["--resize_height=100000", "--resize_width=100000"], "a.png a.txt\n", "", 1,
         "is more than the 1073741824 pixels"),
        (["--resize_height=2000000", "--resize_width=2"], "a.png a.txt\n", "", 1,
         "must be at most 1048576"),
        (["--max_dim=1"], "a.png a.txt\n", "", 0, "leaves 1×0"),
        ([], "a.png\x00 a.txt\n", "", 1, "list.txt:1: a NUL byte in the line"),
        ([], "a.png a.txt\n", "2147483648 0 0 1 1", 1, "label 2147483648 does not fit in an int"),
    ],
)  # fmt: skip
def test_sizes_nul_bytes_and_big_labels_are_one_line(
    tmp_path, run_cli, capsys, caplog, flags, list_text, label_text, code, message
):
    """Round 4 of the hardening (issue 37): no OpenCV allocation of 30 GB, no cv2.error on a
    3000×2 image scaled to max_dim 1, no ValueError on a NUL byte, no overflow on a label."""
    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((3000, 2, 3), np.uint8))
    (tmp_path / "a.txt").write_text(label_text)
    (tmp_path / "list.txt").write_text(list_text)
    args = ["convert_annoset", f"{tmp_path}/", str(tmp_path / "list.txt"), str(tmp_path / "db"),
            "--label_type=txt", *flags]  # fmt: skip
    assert run_cli(args) == code
    err = capsys.readouterr().err + caplog.text  # the skipped image is a logged warning
    assert message in err and "Traceback" not in err, err
    assert len([line for line in err.splitlines() if message in line]) == 1
