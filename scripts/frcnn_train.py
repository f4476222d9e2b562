#!/usr/bin/env python
"""Train py-faster-rcnn's VGG16 end-to-end net on a synthetic box set with caffe2jax's
built-in Faster R-CNN layers, through the CLI, then evaluate it (VOC AP at IoU 0.5).

    python scripts/frcnn_train.py WORKDIR [--iters 2000] [--size 128] [--count 48]
        [--resume-check 4]

The net is read from ``../shared/forks/models/faster_rcnn_vgg16_train.prototxt`` (never copied
into the repository) and rewritten only in data paths and sizes:

* the RoIDataLayer's ``param_str`` gets the LMDB ``source``, ``scale`` = the image side (no
  resize) and ``num_classes`` 4 (background + 3 shapes); the ProposalTargetLayer's
  ``num_classes`` 4; ``cls_score`` / ``bbox_pred`` 4 / 16 outputs;
* the anchor target and proposal layers get ``'scales': (2, 4, 8)`` (anchors of 32–128 px
  instead of 128–512 px: the images are 128 px, not 600);

The solver is py-faster-rcnn's VGG16 end2end solver (base_lr 0.001, step, gamma 0.1,
stepsize 50000, momentum 0.9, weight_decay 0.0005, iter_size 2, display 20, average_loss
100) with ``max_iter`` and ``snapshot`` set here. Its train.py starts from ImageNet VGG16
weights (``--weights``); there are none here, so ``init.caffemodel`` holds random weights for
the convolutions, whose prototxt has no fillers (MSRA: gaussian, std sqrt(2 / fan_in)).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


MODEL = ROOT.parent / "shared" / "forks" / "models" / "faster_rcnn_vgg16_train.prototxt"
CLASSES = 4


def train_prototxt(lmdb: Path, size: int, source: Path = MODEL) -> str:
    """The fork's train prototxt with data paths and sizes rewritten (module docstring)."""
    text = source.read_text()
    data = (f"'num_classes': {CLASSES} \\n'source': '{lmdb}' \\n'scale': {size} "
            f"\\n'max_size': {max(size, 1000)}")  # fmt: skip
    text = text.replace("param_str: \"'num_classes': 21\"", f'param_str: "{data}"', 1)
    text = text.replace(
        "param_str: \"'num_classes': 21\"", f"param_str: \"'num_classes': {CLASSES}\""
    )
    text = text.replace(
        "param_str: \"'feat_stride': 16\"",
        "param_str: \"'feat_stride': 16 \\n'scales': !!python/tuple [2, 4, 8]\"",
    )
    text = re.sub(r"num_output: 21\b", f"num_output: {CLASSES}", text)
    return re.sub(r"num_output: 84\b", f"num_output: {4 * CLASSES}", text)


def solver_text(net: Path, prefix: Path, max_iter: int, snapshot: int) -> str:
    return (
        f'train_net: "{net}"\nbase_lr: 0.001\nlr_policy: "step"\ngamma: 0.1\n'
        "stepsize: 50000\ndisplay: 20\naverage_loss: 100\nmomentum: 0.9\n"
        f'weight_decay: 0.0005\nsnapshot: {snapshot}\nsnapshot_prefix: "{prefix}"\n'
        f"iter_size: 2\nmax_iter: {max_iter}\nrandom_seed: 1\n"
    )


def init_weights(net: Path, out: Path, seed: int = 7, conv_gain: float = 0.72) -> None:
    """Random weights for the layers train.py would load from ImageNet VGG16 (the prototxt
    gives conv1_1 … conv5_3, fc6 and fc7 no filler: all zeros): gaussian with std
    ``sqrt(2 / fan_in)`` (MSRA), times ``conv_gain`` for the convolutions so that conv5_3's
    activations are O(1) as a trained VGG16's are, not the ~50 of raw pixel values. Written
    with pycaffe's Net and ``net.save``."""
    import caffe2jax as caffe

    rng = np.random.default_rng(seed)
    model = caffe.Net(str(net), caffe.TRAIN)
    for blobs in model.params.values():
        w = blobs[0].data
        if w.any():
            continue  # a layer with a filler of its own (the RPN, cls_score, bbox_pred)
        gain = conv_gain if w.ndim == 4 else 1.0
        w[...] = rng.normal(0, gain * np.sqrt(2.0 / np.prod(w.shape[1:])), w.shape)
    model.save(str(out))
