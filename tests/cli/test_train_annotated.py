"""``caffe2jax train`` on SSD's AnnotatedData (runtime/data/readers/annotated_data.py) from a
convert_annoset LMDB: a small SSD with the fork's recipe (distort, expand, samplers, resize,
mirror) learns for a few iterations, the test net reports ``detection_eval`` (solver
``eval_type: "detection"``; DetectionEvaluate on pixel boxes with a ``name_size_file``), and
resuming from a snapshot continues with exactly the same losses and weights as the
uninterrupted run."""

from __future__ import annotations

import re

import numpy as np

from examples.detection.small_ssd import BODY, DATA, EVAL, LOSS, SAMPLERS, SIZE, TRAIN_AUG
from examples.detection.synthetic_boxes import make_dataset
from tests.cli_runner import run_cli

SOLVER = """train_net: "{work}/train.prototxt" test_net: "{work}/test.prototxt"
test_iter: 1 test_interval: 8 test_initialization: false base_lr: 0.003 lr_policy: "multistep"
stepvalue: 10 gamma: 0.5 type: "Adam" momentum: 0.9 momentum2: 0.999 display: 1 max_iter: 12
snapshot: 6 snapshot_prefix: "{work}/snap" random_seed: 5 eval_type: "detection"
ap_version: "11point"
"""


def _setup(work):
    files = make_dataset(work / "data", train=24, test=8, size=SIZE)
    common = {"size": SIZE, "labelmap": files["labelmap"]}
    train = DATA.format(phase="TRAIN", transform=TRAIN_AUG, interp="interp_mode: AREA",
                        source=files["train_lmdb"], batch=4, samplers=SAMPLERS,
                        **common)  # fmt: skip
    test = DATA.format(phase="TEST", transform="", interp="", source=files["test_lmdb"],
                       batch=8, samplers="", **common)  # fmt: skip
    (work / "train.prototxt").write_text(train + BODY + LOSS)
    # evaluated in pixels of each test image's size, as the VGG SSD test nets do
    sizes = work / "test_name_size.txt"
    sizes.write_text("".join(f"{i:06d} {SIZE} {SIZE}\n" for i in range(8)))
    pixels = (f'overlap_threshold: 0.5 name_size_file: "{sizes}" resize_param {{ '
              f"resize_mode: WARP height: {SIZE} width: {SIZE} }}")  # fmt: skip
    (work / "test.prototxt").write_text(
        test + BODY + EVAL.replace("overlap_threshold: 0.5", pixels)
    )
    (work / "solver.prototxt").write_text(SOLVER.format(work=work))


def _losses(log: str) -> dict[int, float]:
    return {int(i): float(v) for i, v in re.findall(r"\] Iteration (\d+) \([^)]*\), loss = (\S+)",
                                                    log)}  # fmt: skip


def test_annotated_data_trains_tests_and_resumes_exactly(tmp_path):
    _setup(tmp_path)
    solver = tmp_path / "solver.prototxt"
    whole = run_cli("train", "--solver", solver, "--log", tmp_path / "whole.log",
                    "--progress", "log")  # fmt: skip
    assert whole.returncode == 0, whole.stderr[-2000:]
    log = (tmp_path / "whole.log").read_text()
    losses = _losses(log)
    assert len(losses) == 12 and np.mean(list(losses.values())[-3:]) < losses[0]
    assert re.search(r"Test net output #0: detection_eval = [\d.]+", log)
    final = (tmp_path / "snap_iter_12.caffemodel").read_bytes()
    state = tmp_path / "snap_iter_6.solverstate"
    resumed = run_cli("train", "--solver", solver, "--snapshot", state, "--log",
                      tmp_path / "resumed.log", "--progress", "log", "--force")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    again = _losses((tmp_path / "resumed.log").read_text())
    assert {i: again[i] for i in range(6, 12)} == {i: losses[i] for i in range(6, 12)}
    assert (tmp_path / "snap_iter_12.caffemodel").read_bytes() == final  # the same weights
