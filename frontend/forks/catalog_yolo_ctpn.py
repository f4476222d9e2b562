"""The YOLOv2 port gklz1982/caffe-yolov2 and CTPN's Caffe (tianzhi0549/CTPN, caffe/) as data
(issue 35), with the wire numbers of each fork's caffe.proto (docs/forks.md gives the commits).
Their layers: :mod:`caffe2jax.lowering.forks.yolov2` and :mod:`caffe2jax.lowering.forks.ctpn`.

gklz1982 puts its own DetectionOutputParameter (YOLO's: side, num_box, coords, biases…) under
SSD's field name and number (LayerParameter 204); caffe.proto holds both in one message and
:mod:`caffe2jax.frontend.forks.forms` tells the two layers apart (form ``yolov2``).
"""

from __future__ import annotations

from caffe2jax.frontend.forks.fork import Fork

YOLO_CTPN_FORKS = (
    Fork("yolov2", "caffe-yolov2 (gklz1982)", "gklz1982/caffe-yolov2@ebb2702",
         adds={"LayerParameter": {"region_loss_param": 202, "reorg_param": 147},
               "DetectionOutputParameter": {"side": 1, "num_box": 3, "coords": 4,
                                            "nms_threshold": 6, "biases": 7,
                                            "label_map_file": 8},
               "DataParameter": {"side": 11}},
         renumbers={"LayerParameter": {"detection_evaluate_param": 203},
                    "DetectionOutputParameter": {"num_classes": 2, "confidence_threshold": 5},
                    "DetectionEvaluateParameter": {"overlap_threshold": 2}},
         types=("DetectionOutput", "RegionLoss", "BoxData", "Reorg", "DetectionLoss",
                "EvalDetection", "DetectionEvaluate")),
    Fork("ctpn", "CTPN", "tianzhi0549/CTPN@f77ec9e (caffe/)",
         adds={"LayerParameter": {"lstm_param": 140, "transpose_param": 142,
                                  "reverse_param": 143}},
         types=("Lstm", "Reverse", "Transpose", "ROIPooling", "SmoothL1Loss")),
)  # fmt: skip
