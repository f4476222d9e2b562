"""ENet's SpatialDropout Python layer (caffe-enet python/spatial_dropout.py, ``python_param``
module ``spatial_dropout``, layer ``SpatialDropoutLayer``) as a built-in.

The phase is the ``'phase'`` of its ``param_str`` (not the net's). ``'TRAIN'``: each (sample,
channel) plane is kept with probability ``1 − p`` and scaled by ``1/(1 − p)``. Any other phase:
``y = x/(1 − p)`` (the fork scales at TEST too). A built-in
(``register_builtin_python_layer``): a user's own ``register_python_layer('spatial_dropout',
...)``, or their own ``spatial_dropout`` module on sys.path (run as Caffe runs it), replaces
this one. ENet's other layers are SegNet's (lowering/forks/segnet.py).
"""

from __future__ import annotations

import ast
from functools import partial

import jax
import jax.numpy as jnp

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.python_layer import register_builtin_python_layer


def spatial_dropout_args(param_str: str, where: str = "") -> tuple[str, float]:
    """(phase, p) of the layer's ``param_str``, a Python dict literal as the fork evals it."""
    try:
        args = ast.literal_eval(param_str)
        phase, p = str(args["phase"]), float(args["p"])
    except (ValueError, SyntaxError, KeyError, TypeError) as err:
        raise NetError(
            f"{where}SpatialDropout's param_str must be a dict with 'phase' and 'p', got "
            f"{param_str!r} "
            f"({type(err).__name__})"
        ) from None
    if not 0 < p < 1:
        raise NetError(f"{where}SpatialDropout's p must be between 0 and 1, got {p}")
    return phase, p


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _channel_drop(x: jax.Array, keep: jax.Array, scale: float) -> jax.Array:
    return x * keep * scale


def _channel_drop_fwd(x, keep, scale):
    return x * keep * scale, keep


def _channel_drop_bwd(scale, res, dy):
    # custom_vjp because the fork's backward uses ``self.vec_w``, the mask forward drew for
    # the *last* sample, for every sample's diff (the true gradient uses each sample's own).
    keep = res
    return dy * keep[-1:] * scale, jnp.zeros_like(keep)


_channel_drop.defvjp(_channel_drop_fwd, _channel_drop_bwd)


def spatial_dropout(layer: ir.Layer, params: list, bottoms: list, ctx) -> list[jax.Array]:
    """ENet's SpatialDropoutLayer (module docstring)."""
    param_str = layer.param.python_param.param_str
    where = f"layer '{layer.name}' (Python spatial_dropout.SpatialDropoutLayer): "
    if len(bottoms) != 1:
        raise NetError(f"{where}SpatialDropout takes one bottom, got {len(bottoms)}")
    (x,) = bottoms
    phase, p = spatial_dropout_args(param_str, where)
    scale = 1.0 / (1.0 - p)
    if phase != "TRAIN":
        return [x * jnp.asarray(scale, x.dtype)]
    keep = jax.random.bernoulli(ctx.key(), 1.0 - p, x.shape[:2] + (1,) * (x.ndim - 2))
    return [_channel_drop(x, keep.astype(x.dtype), scale)]


register_builtin_python_layer("spatial_dropout", "SpatialDropoutLayer", spatial_dropout)
