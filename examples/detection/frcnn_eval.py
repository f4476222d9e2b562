#!/usr/bin/env python
"""Evaluate a Faster R-CNN end-to-end snapshot on synthetic box images: VOC AP at IoU 0.5.

    python examples/detection/frcnn_eval.py TRAIN_PROTOTXT SNAPSHOT.caffemodel \
        [--count 32] [--size 128]

The test net is derived from the train prototxt as py-faster-rcnn's test.prototxt is written:
the RoIDataLayer becomes an Input (data, im_info), the anchor target, proposal target and loss
layers go, the proposal layer (TEST config: 6000 / 300 / 0.7 / 16) writes ``rois``, and a
Softmax gives ``cls_prob``. The snapshot is loaded as it is: caffe2jax's snapshot of a net
running the built-in proposal target layer has ``bbox_pred`` already un-normalized, as
py-faster-rcnn's train.py writes it (weights · stds, bias · stds + means, stds
(0.1, 0.1, 0.2, 0.2) per class; lowering/forks/rcnn_targets.py ``bbox_pred_snapshot``);
py-R-FCN's likewise (rfcn_train.py). Detections are decoded as lib/fast_rcnn/test.py does
(caffe2jax.runtime.outputs.detections.from_rcnn: score > 0.05, per-class NMS 0.3, ≤ 100 per image)
and scored with VOC's rules (caffe2jax.runtime.outputs.average_precision.class_ap: IoU ≥ 0.5
with +1 pixel widths, each ground truth matched once, all-point interpolated AP as VOC2010+
(the fork's ``MaxIntegral``); ``mAP11`` is VOC2007's 11-point AP).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from google.protobuf import text_format

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples.detection.synthetic_boxes import make_image  # noqa: E402

TRAIN_ONLY = ("rpn-data", "rpn_loss_cls", "rpn_loss_bbox", "roi-data", "loss_cls", "loss_bbox")


def test_net_text(train_text: str, height: int, width: int, train_only=TRAIN_ONLY) -> str:
    """The test net of a py-faster-rcnn end2end train prototxt (module docstring), without the
    layers named in ``train_only``."""
    from caffe2jax.frontend import caffe_pb2

    net = caffe_pb2.NetParameter()
    text_format.Parse(train_text, net)
    out = caffe_pb2.NetParameter(name=net.name)
    for layer in net.layer:
        if layer.name in train_only:
            continue
        if layer.type == "Python" and layer.python_param.module == "roi_data_layer.layer":
            data = out.layer.add(name="input", type="Input", top=["data", "im_info"])
            data.input_param.shape.add(dim=[1, 3, height, width])
            data.input_param.shape.add(dim=[1, 3])
            continue
        new = out.layer.add()
        new.CopyFrom(layer)
        if layer.type == "Python" and layer.python_param.module == "rpn.proposal_layer":
            del new.top[:]
            new.top.append("rois")
        if layer.type == "ROIPooling":
            new.bottom[1] = "rois"
    out.layer.add(name="cls_prob", type="Softmax", bottom=["cls_score"], top=["cls_prob"])
    return text_format.MessageToString(out)


def evaluate(train_prototxt: Path, weights: Path, count: int = 32, size: int = 128,
             seed: int = 1000, classes: int = 4, train_only=TRAIN_ONLY) -> dict:  # fmt: skip
    """mAP (all-point and 11-point) and per-class AP of the snapshot ``weights`` (its box
    regressor un-normalized, module docstring) on ``count`` held-out synthetic images
    (``seed`` differs from the training set's); ``train_only`` as for py-faster-rcnn unless
    given (rfcn_train.py: R-FCN's)."""
    import caffe2jax as caffe
    from caffe2jax.runtime.data.readers.roi_data import PIXEL_MEANS
    from caffe2jax.runtime.outputs.average_precision import class_ap
    from caffe2jax.runtime.outputs.detections import from_rcnn

    text = test_net_text(Path(train_prototxt).read_text(), size, size, train_only)
    with tempfile.NamedTemporaryFile("w", suffix=".prototxt", delete=False) as f:
        f.write(text)
    net = caffe.Net(f.name, str(weights), caffe.TEST)
    rng = np.random.default_rng(seed)
    truth, dets = [], {c: [] for c in range(1, classes)}
    for i in range(count):
        chw, boxes, labels = make_image(rng, size)
        truth.append((boxes, labels))
        net.blobs["data"].data[...] = chw.astype(np.float32) - PIXEL_MEANS[:, None, None]
        net.blobs["im_info"].data[...] = [[size, size, 1.0]]
        out = net.forward()
        blobs = net.blobs
        for d in from_rcnn(blobs["rois"].data, out["cls_prob"], out["bbox_pred"], 1.0, size,
                           size):  # fmt: skip
            dets[d.label].append((i, d.score, (d.xmin, d.ymin, d.xmax, d.ymax)))
    aps = {c: class_ap(dets[c], truth, c, "MaxIntegral") for c in dets}
    ap11 = {c: class_ap(dets[c], truth, c, "11point") for c in dets}
    return {"mAP": float(np.mean(list(aps.values()))), "mAP11": float(np.mean(list(ap11.values()))),
            "AP": aps}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("train_prototxt")
    parser.add_argument("weights")
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--size", type=int, default=128)
    args = parser.parse_args()
    print(evaluate(Path(args.train_prototxt), Path(args.weights), args.count, args.size))


if __name__ == "__main__":
    main()
