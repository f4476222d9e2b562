"""MyCaffe's MemoryLoss layer: a loss whose value and gradient come from the trainer.

Reproduced behaviour (MyCaffe/MyCaffe, ``MyCaffe/layers/MemoryLossLayer.cs``):

* one or two bottoms (``MinBottomBlobs`` 1, ``MaxBottomBlobs`` 2) and exactly one top, a 0-d
  loss blob; like every ``*Loss`` layer it gets ``loss_weight: 1`` when none is given;
* the forward raises an ``OnGetLoss`` event: the trainer writes the loss value and (with
  ``EnableLossUpdate = false``, as the policy-gradient trainers do) the bottom diff itself;
* the backward then scales that bottom diff by ``loss_weight / normalizer``, where the
  normaliser is LossLayer's ``get_normalizer(normalization, -1)`` on the bottom's shape:
  with ``axis = 1``, ``outer = count(0, 1)`` (the number of steps fed, i.e. the episode
  length) and ``inner = count(2)``; FULL and VALID (no ignore label: ``valid_count = -1``)
  divide by ``outer·inner``, BATCH_SIZE by ``outer``, NONE by 1, never by less than 1.
  MyCaffe's LossParameter defaults to VALID, so by default the trainer's gradient is divided
  by the episode length.

Here the forward returns a constant 0 loss with no gradient of its own: the RL trainer
(:mod:`caffe2jax.runtime.rl`) computes the bottom diff and pulls it back through the net with
``jax.vjp``. :func:`length_normalizer` gives the trainer the layer's normaliser;
``memory_loss_param.normalize_by_length`` (a caffe2jax extension), when set, overrides the
``loss_param`` choice: true divides by ``outer·inner``, false by 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.lowering.registry import Context, register
from caffe2jax.lowering.util import count, fail

_MODE = caffe_pb2.LossParameter


@register("MemoryLoss", counts=(1, 2, 1, 1))
def memory_loss(
    layer: ir.Layer, params: Sequence[jax.Array], bottoms: Sequence[jax.Array], ctx: Context
) -> list[jax.Array]:
    """MemoryLossLayer forward: a 0-d loss of 0 (the trainer supplies loss and gradient)."""
    if bottoms[0].ndim < 2:
        raise fail(layer, f"bottom 0 must have at least 2 axes, got {list(bottoms[0].shape)}")
    return [jnp.zeros((), ctx.dtype)]


def _mode(layer: ir.Layer) -> int:
    """LayerSetUp: ``normalization`` if set, else legacy ``normalize`` (true VALID, false
    BATCH_SIZE); unset altogether: VALID (MyCaffe's and BVLC's default)."""
    lp = layer.param.loss_param
    if lp.HasField("normalization"):
        return lp.normalization
    if lp.HasField("normalize"):
        return _MODE.VALID if lp.normalize else _MODE.BATCH_SIZE
    return _MODE.VALID


def length_normalizer(layer: ir.Layer, step_shape: Sequence[int]) -> tuple[int, bool]:
    """``(per_step, by_length)``: the layer divides its bottom diff by ``per_step · T`` when
    ``by_length`` is true (``T`` the number of rows fed, the episode length), else by 1.

    ``step_shape`` is bottom 0's shape without its first (row) axis.
    """
    memory = layer.param.memory_loss_param
    inner = count(step_shape, 1)
    if layer.param.HasField("memory_loss_param") and memory.HasField("normalize_by_length"):
        return inner, bool(memory.normalize_by_length)
    mode = _mode(layer)
    if mode == _MODE.NONE:
        return 1, False
    if mode == _MODE.BATCH_SIZE:
        return 1, True
    return inner, True
