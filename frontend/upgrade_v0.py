"""Caffe's V0 → V1 net upgrade (UpgradeV0Net in BVLC src/caffe/util/upgrade_proto.cpp).

A V0 net describes each layer as ``layers { layer { name type <flat fields> } bottom top }``.
Caffe upgrades it in two passes, reproduced here:

1. UpgradeV0PaddingLayers: every V0 ``padding`` layer is removed and its ``pad`` is set on the
   conv or pool layer that consumes it, whose bottom is rewired to the padding layer's bottom.
2. UpgradeV0LayerParameter: each flat V0 field moves into the V1 parameter message of the
   layer's type (``num_output`` of a ``conv`` → ``convolution_param.num_output``, ...);
   ``scale``/``meanfile``/``cropsize``/``mirror`` go to ``transform_param`` for any type.

Of the net itself Caffe keeps only ``name``, ``input``, ``input_dim`` and ``force_backward``.
Where Caffe aborts (unknown V0 type, unknown bottom blob, a padding layer feeding anything but
one conv/pool) or reports an incompatible upgrade and drops data (a field that does not apply to
the layer's type, V1 fields beside a V0 ``layer``), this module raises PrototxtError.
"""

from __future__ import annotations

from google.protobuf import message

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import PrototxtError

V1 = caffe_pb2.V1LayerParameter

#: V0 type string → V1LayerType enum name (Caffe's UpgradeV0LayerType).
V0_LAYER_TYPES: dict[str, str] = {
    "accuracy": "ACCURACY",
    "bnll": "BNLL",
    "concat": "CONCAT",
    "conv": "CONVOLUTION",
    "data": "DATA",
    "dropout": "DROPOUT",
    "euclidean_loss": "EUCLIDEAN_LOSS",
    "flatten": "FLATTEN",
    "hdf5_data": "HDF5_DATA",
    "hdf5_output": "HDF5_OUTPUT",
    "im2col": "IM2COL",
    "images": "IMAGE_DATA",
    "infogain_loss": "INFOGAIN_LOSS",
    "innerproduct": "INNER_PRODUCT",
    "lrn": "LRN",
    "multinomial_logistic_loss": "MULTINOMIAL_LOGISTIC_LOSS",
    "pool": "POOLING",
    "relu": "RELU",
    "sigmoid": "SIGMOID",
    "softmax": "SOFTMAX",
    "softmax_loss": "SOFTMAX_LOSS",
    "split": "SPLIT",
    "tanh": "TANH",
    "window_data": "WINDOW_DATA",
}

_CONV, _IP, _POOL = "convolution_param", "inner_product_param", "pooling_param"
_DATA, _HDF5 = "data_param", "hdf5_data_param"
_IMAGES, _WINDOW = "image_data_param", "window_data_param"

#: V0 field → {V0 type it applies to: (V1 parameter message, field)} (UpgradeV0LayerParameter).
V0_TYPED_FIELDS: dict[str, dict[str, tuple[str, str]]] = {
    "num_output": {"conv": (_CONV, "num_output"), "innerproduct": (_IP, "num_output")},
    "biasterm": {"conv": (_CONV, "bias_term"), "innerproduct": (_IP, "bias_term")},
    "weight_filler": {"conv": (_CONV, "weight_filler"), "innerproduct": (_IP, "weight_filler")},
    "bias_filler": {"conv": (_CONV, "bias_filler"), "innerproduct": (_IP, "bias_filler")},
    "pad": {"conv": (_CONV, "pad"), "pool": (_POOL, "pad")},
    "kernelsize": {"conv": (_CONV, "kernel_size"), "pool": (_POOL, "kernel_size")},
    "group": {"conv": (_CONV, "group")},
    "stride": {"conv": (_CONV, "stride"), "pool": (_POOL, "stride")},
    "pool": {"pool": (_POOL, "pool")},
    "dropout_ratio": {"dropout": ("dropout_param", "dropout_ratio")},
    "local_size": {"lrn": ("lrn_param", "local_size")},
    "alpha": {"lrn": ("lrn_param", "alpha")},
    "beta": {"lrn": ("lrn_param", "beta")},
    "k": {"lrn": ("lrn_param", "k")},
    "source": {
        "data": (_DATA, "source"),
        "hdf5_data": (_HDF5, "source"),
        "images": (_IMAGES, "source"),
        "window_data": (_WINDOW, "source"),
        "infogain_loss": ("infogain_loss_param", "source"),
    },
    "batchsize": {
        "data": (_DATA, "batch_size"),
        "hdf5_data": (_HDF5, "batch_size"),
        "images": (_IMAGES, "batch_size"),
        "window_data": (_WINDOW, "batch_size"),
    },
    "rand_skip": {"data": (_DATA, "rand_skip"), "images": (_IMAGES, "rand_skip")},
    "shuffle_images": {"images": (_IMAGES, "shuffle")},
    "new_height": {"images": (_IMAGES, "new_height")},
    "new_width": {"images": (_IMAGES, "new_width")},
    "concat_dim": {"concat": ("concat_param", "concat_dim")},
    "det_fg_threshold": {"window_data": (_WINDOW, "fg_threshold")},
    "det_bg_threshold": {"window_data": (_WINDOW, "bg_threshold")},
    "det_fg_fraction": {"window_data": (_WINDOW, "fg_fraction")},
    "det_context_pad": {"window_data": (_WINDOW, "context_pad")},
    "det_crop_mode": {"window_data": (_WINDOW, "crop_mode")},
    "hdf5_output_param": {"hdf5_output": ("hdf5_output_param", "")},
}

#: V0 fields Caffe moves to ``transform_param`` whatever the layer type.
V0_TRANSFORM_FIELDS: dict[str, str] = {
    "scale": "scale",
    "meanfile": "mean_file",
    "cropsize": "crop_size",
    "mirror": "mirror",
}

#: V0 fields copied unchanged onto the V1 layer.
V0_COPIED_FIELDS = ("blobs", "blobs_lr", "weight_decay")

#: V0 fields Caffe's upgrade never reads: they are dropped without a message.
V0_IGNORED_FIELDS = ("new_num", "new_channels")

_CONNECTION_FIELDS = frozenset({"layer", "bottom", "top"})


def net_needs_v0_upgrade(net: caffe_pb2.NetParameter) -> bool:
    """Caffe's NetNeedsV0ToV1Upgrade: some ``layers`` entry holds a V0 ``layer``."""
    return any(entry.HasField("layer") for entry in net.layers)


def upgrade_v0_net(net: caffe_pb2.NetParameter, source: str = "") -> caffe_pb2.NetParameter:
    """Caffe's UpgradeV0Net: a new V1 net (``layers`` without V0 ``layer``) from a V0 net."""
    for index, entry in enumerate(net.layers):
        _check_connection(entry, index, source)
    out = caffe_pb2.NetParameter()
    if net.HasField("name"):
        out.name = net.name
    for index, entry in _fold_padding(net, source):
        out.layers.append(_upgrade_layer(entry, index, source))
    out.input.extend(net.input)
    out.input_dim.extend(net.input_dim)
    if net.HasField("force_backward"):
        out.force_backward = net.force_backward
    return out


def _fail(source: str, what: str, index: int, detail: str) -> PrototxtError:
    return PrototxtError(f"{source or '<net>'}: {what} (layers entry {index}): {detail}")


def _describe(entry: caffe_pb2.V1LayerParameter) -> str:
    name = entry.layer.name if entry.HasField("layer") else entry.name
    return f"layer '{name}'" if name else "unnamed layer"


def _check_connection(entry: caffe_pb2.V1LayerParameter, index: int, source: str) -> None:
    """Refuse what Caffe's V0 upgrade would silently drop: anything beside bottom/top/layer."""
    extra = sorted(f.name for f, _ in entry.ListFields() if f.name not in _CONNECTION_FIELDS)
    if not entry.HasField("layer"):
        detail = "a V1-format entry in a net whose other entries are V0 (layers { layer { } })"
        raise _fail(source, _describe(entry), index, f"{detail}; Caffe would drop its fields")
    if extra:
        fields = ", ".join(extra)
        detail = f"V1 field(s) {fields} beside the V0 'layer' (Caffe's upgrade ignores them)"
        raise _fail(source, _describe(entry), index, detail)


def _fold_padding(
    net: caffe_pb2.NetParameter, source: str
) -> list[tuple[int, caffe_pb2.V1LayerParameter]]:
    """Caffe's UpgradeV0PaddingLayers: drop padding layers, moving ``pad`` to their consumer.

    Returns the kept entries (copies) with their index in ``net.layers``.
    """
    last_writer: dict[str, int] = {name: -1 for name in net.input}
    kept: list[tuple[int, caffe_pb2.V1LayerParameter]] = []
    for index, entry in enumerate(net.layers):
        if entry.layer.type != "padding":
            kept.append((index, _copy(entry)))
        for slot, blob in enumerate(entry.bottom):
            if blob not in last_writer:
                detail = f"unknown bottom blob '{blob}' (no earlier layer or input produces it)"
                raise _fail(source, _describe(entry), index, detail)
            writer = last_writer[blob]
            if writer >= 0 and net.layers[writer].layer.type == "padding":
                _absorb_padding(net.layers[writer], entry, kept, slot, (index, source))
        for blob in entry.top:
            last_writer[blob] = index
    return kept


def _absorb_padding(
    padding: caffe_pb2.V1LayerParameter,
    consumer: caffe_pb2.V1LayerParameter,
    kept: list[tuple[int, caffe_pb2.V1LayerParameter]],
    slot: int,
    where: tuple[int, str],
) -> None:
    """The checks and rewiring Caffe applies when a layer reads a padding layer's output."""
    index, source = where
    kind = consumer.layer.type
    problem = None
    if kind not in ("conv", "pool"):
        problem = f"padding layer input to non-convolutional / non-pooling layer type '{kind}'"
    elif len(consumer.bottom) != 1:
        problem = "a layer fed by a padding layer must take a single bottom blob"
    elif len(padding.bottom) != 1 or len(padding.top) != 1:
        problem = f"padding layer '{padding.layer.name}' must have one bottom and one top"
    if problem:
        raise _fail(source, _describe(consumer), index, problem)
    target = kept[-1][1]  # the consumer itself: conv and pool layers are always kept
    target.layer.pad = padding.layer.pad
    target.bottom[slot] = padding.bottom[0]


def _copy(msg: message.Message) -> message.Message:
    out = type(msg)()
    out.CopyFrom(msg)
    return out


def _upgrade_layer(
    entry: caffe_pb2.V1LayerParameter, index: int, source: str
) -> caffe_pb2.V1LayerParameter:
    """Caffe's UpgradeV0LayerParameter for one (padding-folded) V0 entry."""
    out = caffe_pb2.V1LayerParameter()
    out.bottom.extend(entry.bottom)
    out.top.extend(entry.top)
    v0 = entry.layer
    if v0.HasField("name"):
        out.name = v0.name
    if v0.HasField("type"):
        if v0.type not in V0_LAYER_TYPES:
            raise _fail(source, _describe(entry), index, f"unknown V0 layer type '{v0.type}'")
        out.type = V1.LayerType.Value(V0_LAYER_TYPES[v0.type])
    for field, value in v0.ListFields():
        _move_field(out, field.name, value, v0.type, (index, source))
    return out


def _move_field(
    out: caffe_pb2.V1LayerParameter,
    name: str,
    value: object,
    kind: str,
    where: tuple[int, str],
) -> None:
    """Move one set V0 field to its V1 place, as UpgradeV0LayerParameter does."""
    if name in ("name", "type") or name in V0_IGNORED_FIELDS:
        return
    if name in V0_COPIED_FIELDS:
        getattr(out, name).extend(value)
    elif name in V0_TRANSFORM_FIELDS:
        setattr(out.transform_param, V0_TRANSFORM_FIELDS[name], value)
    elif kind in V0_TYPED_FIELDS[name]:
        param_name, field_name = V0_TYPED_FIELDS[name][kind]
        if name == "pool":
            value = caffe_pb2.PoolingParameter.PoolMethod.Value(
                caffe_pb2.V0LayerParameter.PoolMethod.Name(value)
            )
        try:
            _assign(getattr(out, param_name), field_name, value)
        except (ValueError, TypeError) as err:  # e.g. a negative V0 value for a uint32 field
            index, source = where
            detail = f"V0 parameter '{name}' = {str(value)[:40]} does not fit {param_name}: {err}"
            what = f"layer '{out.name}'" if out.name else "unnamed layer"
            raise _fail(source, what, index, detail) from None
    else:
        index, source = where
        detail = f"V0 parameter '{name}' does not apply to layer type '{kind}'"
        raise _fail(source, f"layer '{out.name}'" if out.name else "unnamed layer", index, detail)


def _assign(target: message.Message, field_name: str, value: object) -> None:
    """Set ``target.field_name`` (append for repeated fields); '' copies a whole message."""
    if not field_name:
        target.CopyFrom(value)
        return
    field = target.DESCRIPTOR.fields_by_name[field_name]
    if field.is_repeated:
        getattr(target, field_name).append(value)
    elif field.message_type is not None:
        getattr(target, field_name).CopyFrom(value)
    else:
        setattr(target, field_name, value)
