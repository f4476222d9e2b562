"""SSD's ``eval_type: "detection"`` test pass (weiliu89/caffe solver.cpp TestDetection,
util/bbox_util.cpp ComputeAP): the DetectionEvaluate tops of every test batch accumulated per
output blob and class, then the mean average precision logged as the fork logs it::

    class1: 0.72            (with show_per_class_result)
        Test net output #0: detection_eval = 0.6843

Rows of a DetectionEvaluate top (lowering/forks/ssd_detection_evaluate.py): item −1 rows add num_pos
to their class; other rows add a (score, tp) and a (score, fp) pair unless tp = fp = 0 (a match to a
difficult gt, or caffe2jax's padding rows). mAP = Σ AP / (number of classes with a num_pos row),
classes with no detection counting 0 (the fork warns "Missing true_pos").
"""

from __future__ import annotations

import logging

import numpy as np

from caffe2jax.frontend.errors import SolverError
from caffe2jax.runtime.outputs.average_precision import AP_VERSIONS, average_precision

EVAL_TYPES = ("classification", "detection")


def check_eval(param) -> None:
    """The fork's LOG(FATAL)s for an unknown eval_type / ap_version, raised up front."""
    if param.eval_type not in EVAL_TYPES:
        raise SolverError(f"Unknown evaluation type: {param.eval_type} (known: "
                          f"{', '.join(EVAL_TYPES)})")  # fmt: skip
    if param.eval_type == "detection" and param.ap_version not in AP_VERSIONS:
        raise SolverError(f"Unknown ap_version: {param.ap_version} (known: "
                          f"{', '.join(AP_VERSIONS)})")  # fmt: skip


def compute_ap(tp: list[tuple[float, int]], num_pos: int, fp: list[tuple[float, int]],
               ap_version: str) -> float:  # fmt: skip
    """ComputeAP (:func:`caffe2jax.runtime.outputs.average_precision.average_precision`):
    the average precision of one class from its (score, tp) and (score, fp) pairs."""
    try:
        return average_precision(tp, num_pos, fp, ap_version)
    except ValueError as err:
        raise SolverError(str(err)) from None


class DetectionTally:
    """TestDetection's all_true_pos / all_false_pos / all_num_pos, per output blob."""

    def __init__(self) -> None:
        self.num_pos: dict[int, dict[int, int]] = {}
        self.true_pos: dict[int, dict[int, list]] = {}
        self.false_pos: dict[int, dict[int, list]] = {}

    def add(self, j: int, name: str, result: np.ndarray) -> None:
        """One batch's top ``j`` (the fork CHECKs its width is 5)."""
        if result.ndim < 1 or result.shape[-1] != 5:
            shape = list(result.shape)
            raise SolverError(f"eval_type detection: test net output '{name}' has shape "
                              f"{shape}; DetectionEvaluate rows have 5 values")  # fmt: skip
        num_pos = self.num_pos.setdefault(j, {})
        for row in np.asarray(result, np.float32).reshape(-1, 5):
            item, label = int(row[0]), int(row[1])
            if item == -1:
                num_pos[label] = num_pos.get(label, 0) + int(row[2])
                continue
            tp, fp = int(row[3]), int(row[4])
            if tp == 0 and fp == 0:
                continue
            self.true_pos.setdefault(j, {}).setdefault(label, []).append((float(row[2]), tp))
            self.false_pos.setdefault(j, {}).setdefault(label, []).append((float(row[2]), fp))

    def report(self, log: logging.Logger, names: list[str], ap_version: str,
               per_class: bool) -> dict[str, float]:  # fmt: skip
        """The fork's lines and {output name: mAP}, for outputs 0 … len(true_pos) − 1."""
        scores = {}
        for i in range(len(self.true_pos)):
            if i not in self.true_pos:
                raise SolverError(f"Missing output_blob true_pos: {i}")
            true_pos, false_pos = self.true_pos[i], self.false_pos[i]
            num_pos, total = self.num_pos.get(i, {}), np.float32(0)
            for label in sorted(num_pos):
                if label not in true_pos:
                    log.warning(f"Missing true_pos for label: {label}")
                    continue
                ap = compute_ap(true_pos[label], num_pos[label], false_pos[label], ap_version)
                total = np.float32(total + np.float32(ap))
                if per_class:
                    log.info(f"class{label}: {ap:.6g}")
            m_ap = float(total / np.float32(len(num_pos))) if num_pos else float("nan")
            log.info(f"    Test net output #{i}: {names[i]} = {m_ap:.6g}")
            scores[names[i]] = m_ap
        return scores
