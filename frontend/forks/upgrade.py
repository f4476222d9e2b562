"""Upgrading the forks' deprecated forms to what caffe2jax's lowering reads.

BVLC's UpgradeNetAsNeeded (:mod:`caffe2jax.frontend.upgrade`) knows none of these; they run
right after its V1 → V2 step, on every net:

* V1 layer types of DeepLab v1 (IMAGE_SEG_DATA, INTERP, SEG_ACCURACY, MAT_WRITE, ...),
  C3D v1.0 (CONVOLUTION3D, POOLING3D, VIDEO_DATA, ..., ELTWISE_PRODUCT) and eric612 (RELU6)
  become the type strings their V2 forks register (DeepLab v2's ``Interp``, C3D v1.1's
  ``Convolution3D``, eric612's ``ReLU6``); their V1 parameters keep their names.
  ELTWISE_PRODUCT (C3D v1.0's product-only Eltwise) becomes ``Eltwise`` with PROD.
* PoolingParameter ``ceil_mode`` (the PR #3057 patch) becomes ``round_mode``: ``true`` is
  CEIL, ``false`` FLOOR; both given and disagreeing is refused.
* DeepLab v1's ConvolutionParameter ``hole`` / ``hole_h`` / ``hole_w`` become ``dilation``.
* C3D v1.0 kept its 3-D layers' settings in the 2-D messages (``convolution_param`` with
  ``kernel_depth``…, ``pooling_param``, VIDEO_DATA's ``image_data_param``); they move to
  C3D v1.1's ``convolution3d_param``, ``pooling3d_param`` and ``video_data_param`` +
  ``transform_param`` (crop, mirror, mean), which is where v1.1 reads the same settings.
* A YOLO-form Upsample (one bottom) without ``scale`` gets the YOLO ports' default 1 written
  out (caffe.proto's default 2 is SegNet's).
"""

from __future__ import annotations

import re

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import PrototxtError
from caffe2jax.frontend.forks.catalog import FORKS

Pool = caffe_pb2.PoolingParameter

#: V1 LayerType names the forks add -> the V2 type string (DeepLab v1, C3D v1.0, eric612).
FORK_V1_TYPES: dict[str, str] = {k: v for f in FORKS for k, v in f.v1_types.items()}

#: V1LayerParameter fields of forks copied by name to the V2 layer.
FORK_V1_PARAMS: tuple[str, ...] = tuple(
    name for f in FORKS for name in f.adds.get("V1LayerParameter", {}) if name.endswith("_param")
)


def v1_layer_extras(v1: caffe_pb2.V1LayerParameter, out: caffe_pb2.LayerParameter) -> None:
    """The fork part of UpgradeV1LayerParameter beyond copying parameters by name (the
    upgrade copies FORK_V1_PARAMS with BVLC's): ELTWISE_PRODUCT's operation."""
    if v1.type == caffe_pb2.V1LayerParameter.ELTWISE_PRODUCT:
        if not out.eltwise_param.HasField("operation"):
            out.eltwise_param.operation = caffe_pb2.EltwiseParameter.PROD


def needs_fork_upgrade(net: caffe_pb2.NetParameter) -> bool:
    """Whether :func:`upgrade_fork_layers` would change ``net``."""
    probe = caffe_pb2.NetParameter()
    probe.layer.extend(net.layer)
    upgrade_fork_layers(probe)
    return list(probe.layer) != list(net.layer)


def upgrade_fork_layers(net: caffe_pb2.NetParameter, source: str = "", text: str = "") -> None:
    """The forks' deprecated forms of V2 layers, upgraded in place (see the module doc)."""
    for layer in net.layer:
        where = _Where(source, text, layer.name)
        if layer.pooling_param.HasField("ceil_mode"):
            _ceil_mode(layer, where)
        if _has_hole(layer.convolution_param):
            _hole(layer, where)
        if layer.type == "Convolution3D" and layer.HasField("convolution_param"):
            _conv3d(layer)
        elif layer.type == "Pooling3D" and layer.HasField("pooling_param"):
            _pool3d(layer)
        elif layer.type == "VideoData" and layer.HasField("image_data_param"):
            _video_data(layer)
        elif layer.type == "Upsample" and len(layer.bottom) == 1:
            if not layer.upsample_param.HasField("scale"):
                layer.upsample_param.scale = 1


class _Where:
    """``"file:line: "`` of a layer, found in the text only when an error needs it."""

    def __init__(self, source: str, text: str, name: str):
        self.source, self.text, self.name = source, text, name

    def __str__(self) -> str:
        pattern = r'\bname\s*:\s*"' + re.escape(self.name) + '"'
        match = re.search(pattern, self.text) if self.text else None
        line = self.text.count("\n", 0, match.start()) + 1 if match else 0
        if self.source and line:
            return f"{self.source}:{line}: "
        return f"{self.source}: " if self.source else ""


def _ceil_mode(layer: caffe_pb2.LayerParameter, where: _Where) -> None:
    p = layer.pooling_param
    wanted = Pool.CEIL if p.ceil_mode else Pool.FLOOR
    if p.HasField("round_mode") and p.round_mode != wanted:
        raise PrototxtError(
            f"{where}layer '{layer.name}' (type Pooling): ceil_mode: "
            f"{str(p.ceil_mode).lower()} means round_mode: {Pool.RoundMode.Name(wanted)}, "
            f"but round_mode: {Pool.RoundMode.Name(p.round_mode)} is given too; keep one"
        )
    p.round_mode = wanted
    p.ClearField("ceil_mode")


def _has_hole(p: caffe_pb2.ConvolutionParameter) -> bool:
    return p.HasField("hole") or p.HasField("hole_h") or p.HasField("hole_w")


def _hole(layer: caffe_pb2.LayerParameter, where: _Where) -> None:
    """DeepLab v1's hole: hole_h/hole_w when either is set, else hole (defaults 1)."""
    p = layer.convolution_param
    if p.dilation:
        raise PrototxtError(
            f"{where}layer '{layer.name}' (type {layer.type}): DeepLab v1's hole and "
            "dilation are the same thing; give one"
        )
    if p.HasField("hole_h") or p.HasField("hole_w"):
        dilation = [p.hole_h, p.hole_w]
    else:
        dilation = [p.hole]
    for name in ("hole", "hole_h", "hole_w"):
        p.ClearField(name)
    p.dilation.extend(dilation)


def _conv3d(layer: caffe_pb2.LayerParameter) -> None:
    """C3D v1.0's CONVOLUTION3D settings, as C3D v1.1's Convolution3D reads them."""
    old, new = layer.convolution_param, layer.convolution3d_param
    for name in ("num_output", "bias_term", "group", "kernel_depth", "temporal_stride",
                 "filter_group", "temporal_pad", "weight_filler", "bias_filler"):  # fmt: skip
        if old.HasField(name):
            if name.endswith("_filler"):
                getattr(new, name).CopyFrom(getattr(old, name))
            else:
                setattr(new, name, getattr(old, name))
    for name in ("pad", "kernel_size", "stride"):
        values = list(getattr(old, name))
        if values:
            setattr(new, name, values[0])
    layer.ClearField("convolution_param")


def _pool3d(layer: caffe_pb2.LayerParameter) -> None:
    old, new = layer.pooling_param, layer.pooling3d_param
    for name in ("kernel_size", "stride", "pad", "kernel_depth", "temporal_stride"):
        if old.HasField(name):
            setattr(new, name, getattr(old, name))
    if old.HasField("pool"):
        new.pool = old.pool  # MAX, AVE, STOCHASTIC: the same numbers in both enums
    layer.ClearField("pooling_param")


_VIDEO_FIELDS = ("source", "batch_size", "rand_skip", "shuffle", "new_height", "new_width",
                 "new_length", "use_image", "sampling_rate", "use_temporal_jitter")  # fmt: skip
_VIDEO_TRANSFORM = ("crop_size", "mirror", "mean_file", "scale")


def _video_data(layer: caffe_pb2.LayerParameter) -> None:
    """C3D v1.0's VIDEO_DATA read its image_data_param; v1.1 splits the same settings into
    video_data_param and transform_param."""
    old, new = layer.image_data_param, layer.video_data_param
    for name in _VIDEO_FIELDS:
        if old.HasField(name):
            setattr(new, name, getattr(old, name))
    if old.HasField("show_data"):
        new.show_data = bool(old.show_data)
    for name in _VIDEO_TRANSFORM:
        if old.HasField(name):
            setattr(layer.transform_param, name, getattr(old, name))
    if old.HasField("mean_value"):
        layer.transform_param.mean_value.append(old.mean_value)
    layer.ClearField("image_data_param")
