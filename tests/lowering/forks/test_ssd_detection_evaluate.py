"""lowering/forks/ssd_detection_evaluate.py (SSD's DetectionEvaluate): the header and detection rows
of a hand-worked batch — greedy by score, IoU ≥ threshold inclusive, duplicates and difficult gts,
padding rows in and out."""

from __future__ import annotations

import numpy as np
import pytest

from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.model import compile as compile_net
from tests.lowering.fork_nets import net, ours

PAD8, PAD7 = [-1.0] * 8, [-1.0] * 7
A, B, C, D = [.1, .1, .4, .4], [.6, .6, .9, .9], [0., 0., .5, 1.], [.2, .2, .6, .6]  # fmt: skip
LABEL = np.array([[0, 1, 0, *A, 0], [0, 1, 1, *B, 1], [0, 2, 2, *C, 0], [1, 1, 0, *D, 0],
                  PAD8, PAD8, PAD8], np.float32).reshape(1, 1, 7, 8)  # fmt: skip
DET = np.array(
    [[1, 1, .95, *D],  # tp
     [0, 1, .7, *A],  # fp: A was taken by the 0.8 detection
     [0, 2, .5, 0, 0, .25, 1],  # IoU with C exactly 0.5: tp
     [0, 1, .9, .7, 0, .8, .1],  # overlaps nothing: fp
     [0, 1, .8, .1, .1, .4, .42],  # tp (IoU 0.967 with A)
     [0, 1, .6, *B],  # B is difficult: tp = fp = 0 unless evaluate_difficult_gt
     [1, 2, .4, *C],  # no class-2 gt in image 1: fp
     PAD7, [1, -1, -1, -1, -1, -1, -1], PAD7], np.float32).reshape(1, 1, 10, 7)  # fmt: skip
PAD_ROW = [-2, -1, 0, 0, 0]


def _run(param: str = "") -> np.ndarray:
    text = net('layer { name: "ev" type: "DetectionEvaluate" bottom: "det" bottom: "label" '
               f'top: "y" detection_evaluate_param {{ num_classes: 3 {param} }} }}',
               {"det": DET.shape, "label": LABEL.shape})  # fmt: skip
    return ours(text, {"det": DET, "label": LABEL})["y"]


def test_rows_as_the_fork_writes_them():
    out = _run("background_label_id: 0 overlap_threshold: 0.5 evaluate_difficult_gt: false")
    assert out.shape == (1, 1, 2 + 10, 5)
    expected = [[-1, 1, 2, -1, -1], [-1, 2, 1, -1, -1],  # headers: B is difficult
                [0, 1, .9, 0, 1], [0, 1, .8, 1, 0], [0, 1, .7, 0, 1], [0, 1, .6, 0, 0],
                [0, 2, .5, 1, 0], [1, 1, .95, 1, 0], [1, 2, .4, 0, 1],
                PAD_ROW, PAD_ROW, PAD_ROW]  # fmt: skip
    np.testing.assert_allclose(out[0, 0], np.asarray(expected, np.float32), rtol=1e-6)


def test_difficult_gts_count_when_evaluated():
    out = _run("evaluate_difficult_gt: true")[0, 0]
    assert out[0].tolist() == [-1, 1, 3, -1, -1]
    np.testing.assert_allclose(out[5], [0, 1, 0.6, 1, 0], rtol=1e-6)


def test_threshold_above_the_exact_half_makes_a_false_positive():
    out = _run("overlap_threshold: 0.51")[0, 0]
    np.testing.assert_allclose(out[6], [0, 2, 0.5, 0, 1], rtol=1e-6)


def test_name_size_file_problems_name_the_layer(tmp_path):
    def compile_with(param: str):
        compile_net(net('layer { name: "ev" type: "DetectionEvaluate" bottom: "det" '
                        'bottom: "label" top: "y" detection_evaluate_param { num_classes: 3 '
                        f"{param} }} }}", {"det": DET.shape, "label": LABEL.shape}))  # fmt: skip

    with pytest.raises(NetError, match="'ev'.*Failed to open name size file: .*missing.txt"):
        compile_with(f'name_size_file: "{tmp_path / "missing.txt"}"')
    sizes = tmp_path / "sizes.txt"
    sizes.write_text("a 100 200\n")
    with pytest.raises(NetError, match="'ev'.*FIT_SMALL_SIZE with height_scale"):
        compile_with(f'name_size_file: "{sizes}" resize_param {{ resize_mode: FIT_SMALL_SIZE '
                     "height: 300 width: 300 height_scale: 300 width_scale: 300 }")  # fmt: skip


@pytest.mark.parametrize("classes", [2**31 - 1, 429496730])
def test_a_huge_num_classes_is_refused_before_anything_is_built(classes):
    """num_classes 2^31 − 1 spent 3.7 GB and 21 s building the class list before a refusal;
    now the top's size is checked first (5 values per class, Caffe's INT_MAX)."""
    import time

    text = net('layer { name: "ev" type: "DetectionEvaluate" bottom: "det" bottom: "label" '
               f'top: "y" detection_evaluate_param {{ num_classes: {classes} }} }}',
               {"det": DET.shape, "label": LABEL.shape})  # fmt: skip
    start = time.perf_counter()
    with pytest.raises(NetError, match=r"ev.*num_classes \d+ must be at most 429496729") as error:
        compile_net(text)
    assert time.perf_counter() - start < 10
    assert len(str(error.value).splitlines()) == 1
