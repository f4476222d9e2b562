"""The face-recognition forks as data (issue 35): SphereFace, L-Softmax, center loss and
happynear's caffe-windows (AM-Softmax), with the wire numbers of each fork's caffe.proto
(docs/forks.md gives the commits). Their layers: :mod:`caffe2jax.lowering.forks.face`.
"""

from __future__ import annotations

from caffe2jax.frontend.forks.fork import Fork

_HAPPYNEAR_TYPES = ("CenterLoss", "Flip", "Normalize", "LargeMarginInnerProduct",
                    "MarginInnerProduct", "LabelSpecificAdd")  # fmt: skip
FACE_FORKS = (
    Fork("sphereface", "SphereFace", "wy1iu/sphereface@f20b130 (tools/caffe-sphereface)",
         adds={"LayerParameter": {"margin_inner_product_param": 147}},
         types=("MarginInnerProduct",)),
    Fork("lsoftmax", "L-Softmax", "wy1iu/LargeMargin_Softmax_Loss@c3e9f20",
         adds={"LayerParameter": {"largemargin_inner_product_param": 202}},
         types=("LargeMarginInnerProduct",)),
    Fork("caffe-face", "center loss (caffe-face)", "ydwen/caffe-face@48ff38e",
         adds={"LayerParameter": {"center_loss_param": 147}}, types=("CenterLoss",)),
    Fork("happynear", "happynear's caffe-windows (AM-Softmax)", "happynear/caffe-windows@504d8a8",
         adds={"LayerParameter": {"center_loss_param": 211, "flip_param": 212,
                                  "normalize_param": 214, "largemargin_inner_product_param": 227,
                                  "margin_inner_product_param": 232,
                                  "label_specific_add_param": 241},
               "InnerProductParameter": {"normalize": 7},
               "CenterLossParameter": {"distance_type": 29}},
         types=_HAPPYNEAR_TYPES),
)  # fmt: skip
