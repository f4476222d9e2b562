"""Neuron layers in ONNX, each Caffe formula (lowering/layers/neuron.py) with its special cases:

ReLU → Relu, or LeakyRelu with ``negative_slope``; PReLU → PRelu with one slope per channel
(axis 1) or one shared; ELU → Elu; Sigmoid, TanH, AbsVal → Sigmoid, Tanh, Abs; Power
``(shift + scale·x)^power`` (power 0 or scale 0: the constant; 1: affine; 2: a product);
Exp ``base^(shift + scale·x)`` as ``base^shift·exp(ln(base)·scale·x)``; Log
``log(shift + scale·x)/ln(base)``; BNLL → Softplus; Threshold ``x > t`` as 1/0; Clip → Clip;
Swish ``x·sigmoid(βx)``; Dropout → the identity in TEST (Faster R-CNN's ``scale_train:
false`` form: ``x·(1 − ratio)``; Bayesian SegNet's ``sample_weights_test`` form: ONNX Dropout
in training mode, a new random mask on every run as in the fork).
"""

from __future__ import annotations

import math

import numpy as np

from caffe2jax.lowering.layers.neuron import caffe_log_base
from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site


@register("ReLU")
def relu(site: Site) -> list[str]:
    slope = site.param.relu_param.negative_slope
    if slope:
        return [site.g.op("LeakyRelu", site.bottoms, alpha=slope)]
    return [site.g.op("Relu", site.bottoms)]


@register("PReLU")
def prelu(site: Site) -> list[str]:
    """PReLULayer: a slope per channel (axis 1) broadcast over the axes after it."""
    ndim = len(site.bottom_shapes[0])
    slope = site.array(0)
    slope = slope.reshape((1,)) if slope.ndim == 0 else slope.reshape((-1,) + (1,) * (ndim - 2))
    return [site.g.op("PRelu", [site.bottoms[0], site.g.const(slope, hint="slope")])]


@register("ELU")
def elu(site: Site) -> list[str]:
    return [site.g.op("Elu", site.bottoms, alpha=site.param.elu_param.alpha)]


@register("Sigmoid")
def sigmoid(site: Site) -> list[str]:
    return [site.g.op("Sigmoid", site.bottoms)]


@register("TanH")
def tanh(site: Site) -> list[str]:
    return [site.g.op("Tanh", site.bottoms)]


@register("AbsVal")
def absval(site: Site) -> list[str]:
    return [site.g.op("Abs", site.bottoms)]


def affine(site: Site, x: str, scale: float, shift: float) -> str:
    """``shift + scale·x`` (the identity parts left out, as Caffe computes them)."""
    g = site.g
    if scale != 1:
        x = g.op("Mul", [x, g.f32(scale)])
    if shift != 0:
        x = g.op("Add", [x, g.f32(shift)])
    return x


@register("Power")
def power(site: Site) -> list[str]:
    """PowerLayer (module docstring)."""
    p = site.param.power_param
    (x,) = site.bottoms
    g = site.g
    if p.power == 0 or p.scale == 0:
        value = 1.0 if p.power == 0 else math.pow(p.shift, p.power)
        like = g.op("Shape", [x])
        return [g.op("Expand", [g.f32(value), like])]
    base = affine(site, x, p.scale, p.shift)
    if p.power == 1:
        return [base]
    if p.power == 2:
        return [g.op("Mul", [base, base])]
    return [g.op("Pow", [base, g.f32(p.power)])]


@register("Exp")
def exp(site: Site) -> list[str]:
    p = site.param.exp_param
    log_base = caffe_log_base(site.layer, p.base)
    inner = log_base * p.scale
    outer = 1.0 if p.shift == 0 else math.exp(log_base * p.shift)
    g = site.g
    x = site.bottoms[0] if inner == 1 else g.op("Mul", [site.bottoms[0], g.f32(inner)])
    y = g.op("Exp", [x])
    return [y if outer == 1 else g.op("Mul", [y, g.f32(outer)])]


@register("Log")
def log(site: Site) -> list[str]:
    p = site.param.log_param
    log_base = caffe_log_base(site.layer, p.base)
    if log_base == 0:
        site.refuse("base 1 has no logarithm")
    g = site.g
    y = g.op("Log", [affine(site, site.bottoms[0], p.scale, p.shift)])
    return [y if log_base == 1 else g.op("Mul", [y, g.f32(1.0 / log_base)])]


@register("BNLL")
def bnll(site: Site) -> list[str]:
    return [site.g.op("Softplus", site.bottoms)]


@register("Threshold")
def threshold(site: Site) -> list[str]:
    g = site.g
    above = g.op("Greater", [site.bottoms[0], g.f32(site.param.threshold_param.threshold)])
    return [g.cast(above, 1)]


@register("Clip")
def clip(site: Site) -> list[str]:
    p = site.param.clip_param
    g = site.g
    return [g.op("Clip", [site.bottoms[0], g.f32(p.min), g.f32(p.max)])]


@register("Swish")
def swish(site: Site) -> list[str]:
    beta = site.param.swish_param.beta
    g = site.g
    (x,) = site.bottoms
    inner = x if beta == 1 else g.op("Mul", [x, g.f32(beta)])
    return [g.op("Mul", [x, g.op("Sigmoid", [inner])])]


@register("Dropout", form=("", "scale_train", "sample_test"))
def dropout(site: Site) -> list[str]:
    """DropoutLayer in TEST (module docstring)."""
    p = site.param.dropout_param
    (x,) = site.bottoms
    g = site.g
    if site.layer.form == "sample_test" and p.sample_weights_test:
        ratio, train = g.f32(p.dropout_ratio), g.const(np.asarray(True))
        return [g.op("Dropout", [x, ratio, train])]
    if site.layer.form == "scale_train" and not p.scale_train:
        return [g.op("Mul", [x, g.f32(1.0 - p.dropout_ratio)])]
    return [x]
