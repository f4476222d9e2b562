"""``caffe2jax train`` on SSD's AnnotatedData (runtime/data/annotated_data.py) from a
convert_annoset LMDB: a small SSD with the fork's recipe (distort, expand, samplers, resize,
mirror) learns for a few iterations, the test net reports ``detection_eval`` (solver
``eval_type: "detection"``; DetectionEvaluate on pixel boxes with a ``name_size_file``), and
resuming from a snapshot continues with exactly the same losses and weights as the
uninterrupted run."""

from __future__ import annotations

import re

import numpy as np

from tests.cli_runner import run_cli
from tests.synthetic_boxes import load_make_boxes

SIZE = 48
DATA = """layer {{ name: "data" type: "AnnotatedData" top: "data" top: "label"
  include {{ phase: {phase} }}
  transform_param {{ {transform} mean_value: 127.5 mean_value: 127.5 mean_value: 127.5
    scale: 0.007843 resize_param {{ resize_mode: WARP height: {size} width: {size}
    interp_mode: LINEAR {interp} }} }}
  data_param {{ source: "{source}" batch_size: {batch} backend: LMDB }}
  annotated_data_param {{ {samplers} label_map_file: "{labelmap}" }} }}
"""
TRAIN_AUG = ("mirror: true emit_constraint { emit_type: CENTER } distort_param { "
             "brightness_prob: 0.5 brightness_delta: 32 hue_prob: 0.5 hue_delta: 18 } "
             "expand_param { prob: 0.5 max_expand_ratio: 2 }")  # fmt: skip
SAMPLERS = ("batch_sampler { max_sample: 1 max_trials: 1 } batch_sampler { sampler { "
            "min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 max_aspect_ratio: 2 } "
            "sample_constraint { min_jaccard_overlap: 0.3 } max_sample: 1 "
            "max_trials: 20 }")  # fmt: skip
BODY = """
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param {
  num_output: 16 kernel_size: 3 stride: 2 pad: 1 weight_filler { type: "msra" } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2" convolution_param {
  num_output: 16 kernel_size: 3 stride: 2 pad: 1 weight_filler { type: "msra" } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "loc" type: "Convolution" bottom: "conv2" top: "loc" convolution_param {
  num_output: 12 kernel_size: 3 pad: 1 weight_filler { type: "msra" } } }
layer { name: "loc_perm" type: "Permute" bottom: "loc" top: "loc_perm"
  permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "mbox_loc" type: "Flatten" bottom: "loc_perm" top: "mbox_loc" }
layer { name: "conf" type: "Convolution" bottom: "conv2" top: "conf" convolution_param {
  num_output: 12 kernel_size: 3 pad: 1 weight_filler { type: "msra" } } }
layer { name: "conf_perm" type: "Permute" bottom: "conf" top: "conf_perm"
  permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "mbox_conf" type: "Flatten" bottom: "conf_perm" top: "mbox_conf" }
layer { name: "mbox_priorbox" type: "PriorBox" bottom: "conv2" bottom: "data"
  top: "mbox_priorbox" prior_box_param { min_size: 14 max_size: 30 aspect_ratio: 2 flip: false
  clip: false variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 } }
"""
LOSS = """layer { name: "mbox_loss" type: "MultiBoxLoss" bottom: "mbox_loc" bottom: "mbox_conf"
  bottom: "mbox_priorbox" bottom: "label" top: "mbox_loss" propagate_down: true
  propagate_down: true propagate_down: false propagate_down: false
  multibox_loss_param { num_classes: 4 overlap_threshold: 0.5 neg_pos_ratio: 3 neg_overlap: 0.5
  code_type: CENTER_SIZE } }
"""
EVAL = """layer { name: "conf_reshape" type: "Reshape" bottom: "mbox_conf" top: "conf_reshape"
  reshape_param { shape { dim: 0 dim: -1 dim: 4 } } }
layer { name: "conf_softmax" type: "Softmax" bottom: "conf_reshape" top: "conf_softmax"
  softmax_param { axis: 2 } }
layer { name: "conf_flat" type: "Flatten" bottom: "conf_softmax" top: "conf_flat" }
layer { name: "detection_out" type: "DetectionOutput" bottom: "mbox_loc" bottom: "conf_flat"
  bottom: "mbox_priorbox" top: "detection_out" detection_output_param { num_classes: 4
  nms_param { nms_threshold: 0.45 top_k: 100 } code_type: CENTER_SIZE keep_top_k: 50
  confidence_threshold: 0.01 } }
layer { name: "detection_eval" type: "DetectionEvaluate" bottom: "detection_out" bottom: "label"
  top: "detection_eval" detection_evaluate_param { num_classes: 4 overlap_threshold: 0.5 } }
"""
SOLVER = """train_net: "{work}/train.prototxt" test_net: "{work}/test.prototxt"
test_iter: 1 test_interval: 8 test_initialization: false base_lr: 0.003 lr_policy: "multistep"
stepvalue: 10 gamma: 0.5 type: "Adam" momentum: 0.9 momentum2: 0.999 display: 1 max_iter: 12
snapshot: 6 snapshot_prefix: "{work}/snap" random_seed: 5 eval_type: "detection"
ap_version: "11point"
"""


def _setup(work):
    files = load_make_boxes().make_dataset(work / "data", train=24, test=8, size=SIZE)
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
