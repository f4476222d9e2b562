"""The long tail's forks as data (issue 35): soeaver's caffe-priv (the Caffe of
soeaver/caffe-model's PSPNet-SELU and FPN models) and RCF (yun-liu/rcf), with the wire numbers
of each fork's caffe.proto (docs/forks.md gives the commits). Their layers:
:mod:`caffe2jax.lowering.forks.selu`, :mod:`caffe2jax.lowering.forks.fpn` and
:mod:`caffe2jax.lowering.forks.rcf`.
"""

from __future__ import annotations

from caffe2jax.frontend.forks.fork import Fork

TAIL_FORKS = (
    Fork("caffe-priv", "soeaver's caffe-priv (PSPNet-SELU, FPN)",
         "soeaver/py-RFCN-priv@ec89b86 (caffe-priv)",
         adds={"LayerParameter": {"selu_param": 1001, "selu_dropout_param": 1002,
                                  "interp_param": 20001},
               "InterpParameter": {"use_blob_size": 7}},
         types=("SeLu", "SeLuDropout", "Interp")),
    # AutoCrop has no parameter message: its offset comes from the net (coordinate maps).
    Fork("rcf", "RCF", "yun-liu/rcf@ce460ff", types=("AutoCrop",)),
)  # fmt: skip
