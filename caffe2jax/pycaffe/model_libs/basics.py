"""The building blocks of the SSD fork's ``caffe.model_libs`` (weiliu89/caffe, branch ssd,
python/caffe/model_libs.py): the file helpers, ``UnpackVariable``, ``ConvBNLayer`` (a
convolution, optionally followed by BatchNorm + Scale or Bias and a ReLU, all in place) and
``CreateAnnotatedDataLayer``. Each emits the layers, names and parameters the fork's function
emits, in the same order, on caffe2jax's :class:`~caffe2jax.pycaffe.net_spec.NetSpec`."""

from __future__ import annotations

import os
from typing import Any

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.pycaffe.net_spec import NetSpec, Top
from caffe2jax.pycaffe.net_spec import layers as L
from caffe2jax.pycaffe.net_spec import params as P


def check_if_exist(path: str) -> bool:
    """Whether ``path`` exists (the fork's scripts call it and ignore the answer)."""
    return os.path.exists(path)


def make_if_not_exist(path: str) -> None:
    """Create the folder ``path`` (and its parents) unless it exists."""
    if not os.path.exists(path):
        os.makedirs(path)


def UnpackVariable(var: Any, num: int) -> list:
    """``var`` as a list of ``num`` values: a list of ``num`` is kept, a one-element list or a
    single value is repeated (``kernel_size=[1, 7]`` → h, w; ``kernel_size=3`` → 3, 3)."""
    if isinstance(var, list | tuple):
        if len(var) == num:
            return list(var)
        if len(var) != 1:
            raise CaffeError(f"UnpackVariable: {var!r} has {len(var)} values; give 1 or {num}")
        return [var[0]] * num
    return [var] * num


def _bn_kwargs(lr_mult: float, use_scale: bool, bn_params: dict) -> tuple[dict, dict, dict]:
    """(convolution, BatchNorm, Scale-or-Bias) keywords of a batch-normalized ConvBNLayer: a
    convolution without bias (gaussian std 0.01), BatchNorm's three statistics frozen
    (eps 0.001, moving_average_fraction 0.999 unless given; with ``use_global_stats`` the
    fraction is not written and the Scale/Bias terms do not learn)."""
    conv = {
        "param": [dict(lr_mult=lr_mult, decay_mult=1)],
        "weight_filler": dict(type="gaussian", std=0.01),
        "bias_term": False,
    }
    frozen = [dict(lr_mult=0, decay_mult=0) for _ in range(3)]
    eps = bn_params.get("eps", 0.001)
    if bn_params.get("use_global_stats", False):
        bn = {"param": frozen, "eps": eps, "use_global_stats": bn_params["use_global_stats"]}
        term_lr = 0
    else:
        fraction = bn_params.get("moving_average_fraction", 0.999)
        bn = {"param": frozen, "eps": eps, "moving_average_fraction": fraction}
        term_lr = lr_mult
    if use_scale:
        after = {
            "bias_term": True,
            "param": [dict(lr_mult=term_lr, decay_mult=0), dict(lr_mult=term_lr, decay_mult=0)],
            "filler": dict(type="constant", value=1.0),
            "bias_filler": dict(type="constant", value=0.0),
        }
    else:
        after = {
            "param": [dict(lr_mult=term_lr, decay_mult=0)],
            "filler": dict(type="constant", value=0.0),
        }
    return conv, bn, after


def _plain_conv_kwargs(lr_mult: float) -> dict:
    """A convolution with bias: weights xavier (lr_mult, decay 1), bias 0 (2·lr_mult, decay 0)."""
    return {
        "param": [dict(lr_mult=lr_mult, decay_mult=1), dict(lr_mult=2 * lr_mult, decay_mult=0)],
        "weight_filler": dict(type="xavier"),
        "bias_filler": dict(type="constant", value=0),
    }


def _geometry(kernel_size: Any, pad: Any, stride: Any) -> dict:
    """A square kernel writes kernel_size/pad/stride (the h values); a rectangular one
    kernel_h/kernel_w, pad_h/pad_w, stride_h/stride_w, as the fork does."""
    kernel_h, kernel_w = UnpackVariable(kernel_size, 2)
    pad_h, pad_w = UnpackVariable(pad, 2)
    stride_h, stride_w = UnpackVariable(stride, 2)
    if kernel_h == kernel_w:
        return dict(kernel_size=kernel_h, pad=pad_h, stride=stride_h)
    return dict(
        kernel_h=kernel_h,
        kernel_w=kernel_w,
        pad_h=pad_h,
        pad_w=pad_w,
        stride_h=stride_h,
        stride_w=stride_w,
    )


def ConvBNLayer(
    net: NetSpec,
    from_layer: str,
    out_layer: str,
    use_bn: bool,
    use_relu: bool,
    num_output: int,
    kernel_size: Any,
    pad: Any,
    stride: Any,
    dilation: int = 1,
    use_scale: bool = True,
    lr_mult: float = 1,
    conv_prefix: str = "",
    conv_postfix: str = "",
    bn_prefix: str = "",
    bn_postfix: str = "_bn",
    scale_prefix: str = "",
    scale_postfix: str = "_scale",
    bias_prefix: str = "",
    bias_postfix: str = "_bias",
    group: int | None = None,
    engine: int | None = None,
    **bn_params: Any,
) -> None:
    """The fork's ConvBNLayer: ``<conv_prefix><out_layer><conv_postfix>`` (a Convolution), then
    with ``use_bn`` BatchNorm ``<bn_prefix><out_layer><bn_postfix>`` and Scale (``use_scale``)
    or Bias, in place, then ReLU ``<conv name>_relu`` in place; ``dilation`` is written when
    > 1. ``group``/``engine`` (MobileNet generators' ConvBNLayer) are written when given."""
    if use_bn:
        conv_kwargs, bn_kwargs, after_kwargs = _bn_kwargs(lr_mult, use_scale, bn_params)
    else:
        conv_kwargs = _plain_conv_kwargs(lr_mult)
    extra = {k: v for k, v in (("group", group), ("engine", engine)) if v is not None}
    conv_name = f"{conv_prefix}{out_layer}{conv_postfix}"
    net[conv_name] = L.Convolution(
        net[from_layer],
        num_output=num_output,
        **extra,
        **_geometry(kernel_size, pad, stride),
        **conv_kwargs,
    )
    if dilation > 1:
        net.update(conv_name, {"dilation": dilation})
    if use_bn:
        bn_name = f"{bn_prefix}{out_layer}{bn_postfix}"
        net[bn_name] = L.BatchNorm(net[conv_name], in_place=True, **bn_kwargs)
        if use_scale:
            scale_name = f"{scale_prefix}{out_layer}{scale_postfix}"
            net[scale_name] = L.Scale(net[bn_name], in_place=True, **after_kwargs)
        else:
            bias_name = f"{bias_prefix}{out_layer}{bias_postfix}"
            net[bias_name] = L.Bias(net[bn_name], in_place=True, **after_kwargs)
    if use_relu:
        net[f"{conv_name}_relu"] = L.ReLU(net[conv_name], in_place=True)


def CreateAnnotatedDataLayer(
    source: str,
    batch_size: int = 32,
    backend: int = P.Data.LMDB,
    output_label: bool = True,
    train: bool = True,
    label_map_file: str = "",
    anno_type: int | None = None,
    transform_param: dict | None = None,
    batch_sampler: list | None = None,
) -> Top | tuple[Top, ...]:
    """The fork's AnnotatedData layer named ``data``: included in TRAIN (``train``) or TEST,
    ``data_param`` (batch_size, backend, source), ``annotated_data_param`` (label_map_file,
    batch_sampler: one empty sampler unless given, anno_type when given); two tops (data,
    label) with ``output_label``, else one."""
    phase = caffe_pb2.Phase.Value("TRAIN" if train else "TEST")
    annotated = {
        "label_map_file": label_map_file,
        "batch_sampler": [{}] if batch_sampler is None else batch_sampler,
    }
    if anno_type is not None:
        annotated["anno_type"] = anno_type
    return L.AnnotatedData(
        name="data",
        annotated_data_param=annotated,
        data_param=dict(batch_size=batch_size, backend=backend, source=source),
        ntop=2 if output_label else 1,
        include=dict(phase=phase),
        transform_param={} if transform_param is None else transform_param,
    )
