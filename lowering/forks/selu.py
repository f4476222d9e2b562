"""soeaver's caffe-priv SELU layers (the PSPNet-SELU models of soeaver/caffe-model), from
soeaver/py-RFCN-priv@ec89b86 caffe-priv/src/caffe/layers/selu_layer.cpp and
selu_dropout_layer.cpp (docs/forks.md):

* SeLu (``selu_param``: lambda 1.050700987, alpha 1.67326324): ``λ·x`` for ``x > 0``, else
  ``λ·α·(exp(x) − 1)`` (``exp(x) − 1`` as the fork writes it, not expm1). Its backward,
  ``λ·dy`` for ``x > 0`` else ``λ·α·dy·exp(x)``, is the derivative (at 0 the negative side).
* SeLuDropout (``selu_dropout_param``: dropout_ratio 0.1, alpha −1.75809934), alpha dropout:
  with ``q = 1 − ratio``, ``a = (q·(1 + α²·(1 − q)))^−½`` and ``b = −a·(1 − q)·α`` (float32,
  as LayerSetUp computes them), TRAIN keeps each element with probability ``q`` and gives
  ``a·x + b`` for the kept ones and ``a·α + b`` for the dropped ones; its backward is
  ``a·dy`` on the kept elements and 0 elsewhere, the derivative. TEST is the identity.
  The ratio must lie in (0, 1), as the fork's DCHECKs say.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend import ir
from caffe2jax.lowering.registry import Context, register
from caffe2jax.lowering.util import fail

Arrays = Sequence[jax.Array]


def selu_constants(layer: ir.Layer) -> tuple[float, float]:
    """(λ, α) of ``selu_param``, refused when not finite."""
    p = layer.param.selu_param
    if not (np.isfinite(getattr(p, "lambda")) and np.isfinite(p.alpha)):
        raise fail(layer, "selu_param lambda and alpha must be finite")
    return float(getattr(p, "lambda")), float(p.alpha)


@register("SeLu", counts=(1, 1, 1, 1))
def selu(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context) -> list[jax.Array]:
    """SeLuLayer::Forward_cpu (see the module); the exponential only sees ``x ≤ 0``."""
    (x,) = bottoms
    lam, alpha = selu_constants(layer)
    positive = x > 0
    lam_alpha = float(np.float32(lam) * np.float32(alpha))  # weak: x's dtype
    negative = lam_alpha * (jnp.exp(jnp.where(positive, 0, x)) - 1)
    return [jnp.where(positive, float(np.float32(lam)) * x, negative)]


def alpha_dropout_constants(layer: ir.Layer) -> tuple[float, float, float, float]:
    """(q, α, a, b) as SeLuDropoutLayer::LayerSetUp computes them in float32."""
    p = layer.param.selu_dropout_param
    ratio, alpha = np.float32(p.dropout_ratio), np.float32(p.alpha)
    if not 0 < ratio < 1:
        raise fail(layer, f"selu_dropout_param dropout_ratio must be in (0, 1), got {ratio}")
    if not np.isfinite(alpha):
        raise fail(layer, f"selu_dropout_param alpha must be finite, got {alpha}")
    one = np.float32(1)
    q = one - ratio
    tmp = np.float32(q * (one + alpha * alpha * (one - q)))
    a = np.float32(np.power(np.float64(tmp), -0.5))
    b = np.float32(-a * (one - q) * alpha)
    return float(q), float(alpha), float(a), float(b)


@register("SeLuDropout", counts=(1, 1, 1, 1))
def selu_dropout(layer: ir.Layer, params: Arrays, bottoms: Arrays, ctx: Context):
    """SeLuDropoutLayer::Forward_cpu (see the module): a Bernoulli(q) mask from the layer's
    key in TRAIN; the identity in TEST."""
    (x,) = bottoms
    q, alpha, a, b = alpha_dropout_constants(layer)
    if not ctx.train:
        return [x]
    keep = jax.random.bernoulli(ctx.key(), q, x.shape)
    kept = jnp.where(keep, x, jnp.asarray(alpha, x.dtype))
    return [a * kept + b]
