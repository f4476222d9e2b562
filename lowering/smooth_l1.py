"""The one ``SmoothL1Loss`` registration: the type string names two layers
(frontend/forks/forms.py), dispatched on ``layer.form`` — ``ssd`` (lowering/smooth_l1_ssd.py) or
``rcnn`` (Faster R-CNN's, with ``sigma`` and inside/outside weights: lowering/forks/rcnn.py,
``_rcnn``).
"""

from __future__ import annotations

import importlib

from caffe2jax.lowering.registry import register
from caffe2jax.lowering.smooth_l1_ssd import _ssd
from caffe2jax.lowering.util import fail


def _rcnn_form():
    """The rcnn form's lowering, or None where this build has none."""
    try:
        module = importlib.import_module("caffe2jax.lowering.forks.rcnn")
    except ModuleNotFoundError:
        return None
    return getattr(module, "_rcnn", None)


@register("SmoothL1Loss", counts=(2, 4, 1, 1))
def smooth_l1_loss(layer, params, bottoms, ctx):
    """SSD's or Faster R-CNN's SmoothL1Loss, by the layer's form."""
    if layer.form == "ssd":
        return _ssd(layer, params, bottoms, ctx)
    rcnn = _rcnn_form()
    if rcnn is None:
        raise fail(layer, "Faster R-CNN's SmoothL1Loss (form 'rcnn': sigma, inside/outside "
                          "weights) is not supported in this build; SSD's form (2 or 3 "
                          "bottoms, no smooth_l1_loss_param) is")  # fmt: skip
    return rcnn(layer, params, bottoms, ctx)
