"""Faster R-CNN's layers (rbgirshick/caffe-fast-rcnn, which R-FCN's Caffe builds on): SmoothL1Loss
(form ``rcnn``), Dropout (form ``scale_train``) and py-faster-rcnn's RoIDataLayer as the data
layer type ``RoIData``. ROIPooling: lowering/forks/rcnn_roi.py; the Python layers of
py-faster-rcnn's lib/rpn: lowering/forks/rcnn_proposal.py, rcnn_targets.py.

SmoothL1Loss as caffe-fast-rcnn's smooth_l1_loss_layer.cu computes it:

* ``smooth_l1_loss_param.sigma`` (default 1); σ² = sigma².
* Bottoms: pred, target and optionally inside and outside weights (2 or 4 bottoms, every one
  of pred's shape). ``d = w_in·(pred − target)`` (``w_in`` = 1 without weights);
  ``f(d) = 0.5·σ²·d²`` where ``|d| < 1/σ²``, else ``|d| − 0.5/σ²``.
* loss = ``Σ w_out·f(d) / N`` with N = pred's first dimension (``bottom[0]->num()``), not the
  number of elements nor of non-zero weights.
* Backward: ``±w_in·w_out·f'(d)/N`` to pred and target — the true gradient of this forward, so
  JAX's derivative is used. Caffe sends no gradient to the weight bottoms (py-faster-rcnn's
  target layers have none to give); they are held constant here (``stop_gradient``).

The fork's layer is GPU-only (its CPU forward is NOT_IMPLEMENTED); this runs everywhere.

Dropout with ``scale_train: false`` keeps the TRAIN mask unscaled and multiplies by
``1 − dropout_ratio`` in TEST (caffe-fast-rcnn's dropout_layer.cpp); ``scale_train: true`` is
BVLC's layer.

``RoIData``: a net naming ``python_param { module: 'roi_data_layer.layer' layer:
'RoIDataLayer' }`` is read by the runtime's ``roi_data`` reader (caffe2jax.runtime.data) unless
the user's own module is importable (then it runs on the host, as in Caffe).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from caffe2jax.frontend import ir
from caffe2jax.lowering.layers import neuron
from caffe2jax.lowering.layers.data import from_source
from caffe2jax.lowering.python_layer import register_builtin_python_data_layer
from caffe2jax.lowering.registry import Context, register
from caffe2jax.lowering.util import fail


def _checked(layer: ir.Layer, bottoms: list) -> None:
    if len(bottoms) not in (2, 4):
        raise fail(
            layer,
            f"caffe-fast-rcnn's SmoothL1Loss takes 2 bottoms (pred, target) or 4 (pred, "
            f"target, inside weights, outside weights); got {len(bottoms)}",
        )
    shape = tuple(bottoms[0].shape)
    for i, b in enumerate(bottoms[1:], 1):
        if tuple(b.shape) != shape:
            raise fail(
                layer, f"bottom {i} has shape {list(b.shape)}, bottom 0 (pred) {list(shape)}"
            )


@register("SmoothL1Loss", form="rcnn", counts=(2, 4, 1, 1))
def smooth_l1_rcnn(layer: ir.Layer, params, bottoms, ctx) -> list[jax.Array]:
    """caffe-fast-rcnn's SmoothL1Loss forward (see the module docstring): one scalar top."""
    bottoms = list(bottoms)
    _checked(layer, bottoms)
    sigma2 = float(layer.param.smooth_l1_loss_param.sigma) ** 2
    pred, target = bottoms[0], bottoms[1]
    diff = pred - target
    if len(bottoms) == 4:
        inside, outside = (lax.stop_gradient(b).astype(pred.dtype) for b in bottoms[2:])
        diff = inside * diff
    absd = jnp.abs(diff)
    small = absd < 1.0 / sigma2
    # the untaken branch is evaluated with a safe argument so its gradient is finite
    quad = 0.5 * sigma2 * jnp.square(jnp.where(small, diff, 0.0))
    lin = jnp.where(small, 0.0, absd) - 0.5 / sigma2
    per = jnp.where(small, quad, lin)
    if len(bottoms) == 4:
        per = outside * per
    num = pred.shape[0] if pred.ndim else 1
    return [jnp.sum(per) / num]


@register("Dropout", form="scale_train", counts=(1, 1, 1, 1), bf16=True)
def dropout_scale_train(layer: ir.Layer, params, bottoms, ctx: Context) -> list[jax.Array]:
    """caffe-fast-rcnn's DropoutLayer: BVLC's, or with ``scale_train: false`` the TRAIN mask
    unscaled and TEST scaled by ``1 − dropout_ratio``."""
    (x,) = bottoms
    ratio = neuron.dropout_ratio(layer)
    scaled = layer.param.dropout_param.scale_train
    if not ctx.train:
        return [x if scaled else x * (1.0 - ratio)]
    return [neuron.dropped(x, ratio, ctx, scale=scaled)]


@register("RoIData", counts=(0, 0, 3, 3), source=True, feed="pipeline")
def roi_data(layer: ir.Layer):
    """py-faster-rcnn's RoIDataLayer, read by the runtime: tops data, im_info, gt_boxes."""
    return from_source(layer)


register_builtin_python_data_layer("roi_data_layer.layer", "RoIDataLayer", "RoIData")
