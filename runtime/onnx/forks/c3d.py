"""C3D's 3-D layers in ONNX (facebook/C3D v1.0 and v1.1; lowering/forks/c3d.py):

* Convolution3D → a 3-D Conv: weights ``(num_output, C, kd, k, k)``, the bias blob
  ``(1, 1, 1, 1, num_output)`` flattened, zero padding ``(temporal_pad, pad, pad)``.
* Pooling3D: C3D's sizes ``ceil((n + 2·pad − k)/stride) + 1`` (no temporal padding, no BVLC
  last-window rule), windows clipped to the input: MAX → MaxPool with the end padding the last
  windows need; AVE divides by the window clipped to ``[−pad, n + pad)`` (``[0, L)`` in time):
  the input zero-padded by ``pad``, then AveragePool with ``count_include_pad=0``.
"""

from __future__ import annotations

from caffe2jax.lowering.forks.c3d import P3, conv3d_geometry, pool3d_spec
from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site

FORMS = ("", "c3d-v1.0")


@register("Convolution3D", form=FORMS)
def convolution3d(site: Site) -> list[str]:
    kernel, stride, pad = conv3d_geometry(site.layer, site.bottom_shapes[0])
    g = site.g
    inputs = [site.bottoms[0], site.blob(0)]
    if site.param.convolution3d_param.bias_term:
        inputs.append(g.const(site.array(1).reshape(-1), hint="bias"))
    return [g.op("Conv", inputs, kernel_shape=list(kernel), strides=list(stride),
                 pads=list(pad) * 2)]  # fmt: skip


@register("Pooling3D", form=FORMS)
def pooling3d(site: Site) -> list[str]:
    shape = site.bottom_shapes[0]
    method, kernel, stride, pad, out = pool3d_spec(site.layer, shape)
    g = site.g
    x = site.bottoms[0]
    ends = [max(0, (o - 1) * s + k - n - q)
            for n, k, s, q, o in zip(shape[2:], kernel, stride, pad, out)]  # fmt: skip
    attrs = dict(kernel_shape=list(kernel), strides=list(stride))
    if method == P3.MAX:
        if any(e >= k for e, k in zip(ends, kernel)):
            site.refuse("a Pooling3D whose last window starts past the input")
        return [g.op("MaxPool", [x], pads=[0, 0, 0, *ends], **attrs)]
    if any(pad):
        x = g.op("Pad", [x, g.i64([0, 0, *pad, 0, 0, *pad])])
    tails = [max(0, e - q) for e, q in zip(ends, pad)]
    if any(t >= k for t, k in zip(tails, kernel)):
        site.refuse("a Pooling3D whose last window starts past the input")
    y = g.op("AveragePool", [x], pads=[0, 0, 0, *tails], count_include_pad=0, **attrs)
    grown = [n + 2 * q for n, q in zip(shape[2:], pad)]
    got = [(n + t - k) // s + 1 for n, t, k, s in zip(grown, tails, kernel, stride)]
    if got != list(out):
        y = g.slice(y, [0, 0, 0], list(out), [2, 3, 4])
    return [y]
