"""The SSD-derived detector forks as data (issue 35): FaceBoxes, RefineDet and TextBoxes++,
each a copy of weiliu89's SSD Caffe with the wire numbers of its own caffe.proto (docs/forks.md
gives the commits and the collisions). Their layers: :mod:`caffe2jax.lowering.forks.faceboxes`,
:mod:`caffe2jax.lowering.forks.refinedet`, :mod:`caffe2jax.lowering.forks.textboxes`.

FaceBoxes adds no field: its PriorBox computes other priors from SSD's fields, so the net's
dialect says which PriorBox it has (``dialect='faceboxes'``, or from the text: a PriorBox with
three min sizes among them 32 and 64, the layer its fork densifies to 21 priors per cell).
"""

from __future__ import annotations

from caffe2jax.frontend.forks.fork import Fork

#: SSD's LayerParameter numbers, the same in all three forks' caffe.proto.
_SSD_BASE = {
    "LayerParameter": {
        "annotated_data_param": 200, "multibox_loss_param": 201, "permute_param": 202,
        "prior_box_param": 203, "detection_output_param": 204, "detection_evaluate_param": 205,
        "norm_param": 206, "video_data_param": 207},
    "SolverParameter": {"eval_type": 41, "ap_version": 42, "plateau_winsize": 43},
    "SolverState": {"minimum_loss": 5, "iter_last_event": 6},
}  # fmt: skip
_SSD_TYPES = ("AnnotatedData", "MultiBoxLoss", "Permute", "PriorBox", "DetectionOutput",
              "DetectionEvaluate", "Normalize", "SmoothL1Loss")  # fmt: skip

SSD_DERIVED_FORKS = (
    Fork("faceboxes", "FaceBoxes", "sfzhang15/FaceBoxes@b52cc92",
         adds={**_SSD_BASE, "SolverParameter": {**_SSD_BASE["SolverParameter"],
                                                "show_per_class_result": 44}},
         types=_SSD_TYPES),
    Fork("refinedet", "RefineDet", "sfzhang15/RefineDet@52b6fe2",
         adds={**_SSD_BASE, "DetectionOutputParameter": {"objectness_score": 24},
               "MultiBoxLossParameter": {"objectness_score": 24}},
         types=_SSD_TYPES),
    Fork("textboxes", "TextBoxes++", "MhLiao/TextBoxes_plusplus@39d4898",
         adds={**_SSD_BASE, "PriorBoxParameter": {"denser_prior_boxes": 14},
               "DetectionOutputParameter": {"use_polygon": 13},
               "DetectionEvaluateParameter": {"use_polygon": 7},
               "MultiBoxLossParameter": {"use_polygon": 24},
               "Annotation": {"rbox": 3, "polygon": 4},
               "NormalizedRBox": {n: i for i, n in enumerate(
                   ("x1", "y1", "x2", "y2", "h", "difficult", "score", "size"), 1)},
               "NormalizedPolygon": {n: i for i, n in enumerate(
                   ("x1", "y1", "x2", "y2", "x3", "y3", "x4", "y4", "difficult", "score",
                    "size"), 1)}},
         types=_SSD_TYPES),
)  # fmt: skip

#: FaceBoxes' densified prior sizes: min_size 32 gives 4x4 priors per cell, 64 gives 2x2.
FACEBOXES_DENSE = {32: 4, 64: 2}


def faceboxes_signature(min_sizes) -> bool:
    """Whether a PriorBox's min sizes are the layer FaceBoxes densifies (3 sizes, 32 and 64
    among them): its fork gives such a layer 21 priors per cell, SSD's 3."""
    sizes = [int(s) for s in min_sizes if 0 < s < 2**31]
    return len(sizes) == 3 and all(d in sizes for d in FACEBOXES_DENSE)
