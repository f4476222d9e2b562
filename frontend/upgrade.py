"""Caffe's upgrade_proto in Python: deprecated net and solver definitions → current format.

Reproduces BVLC master's UpgradeNetAsNeeded (src/caffe/util/upgrade_proto.cpp), in its order:

1. V0 → V1 (UpgradeV0Net, see :mod:`caffe2jax.frontend.upgrade_v0`);
2. data transformation (UpgradeNetDataTransformation): V1 DATA / IMAGE_DATA / WINDOW_DATA
   ``scale``, ``mean_file``, ``crop_size``, ``mirror`` move into ``transform_param``;
3. V1 → current (UpgradeV1Net): ``layers`` → ``layer``, type enum → type string, ``blobs_lr`` /
   ``weight_decay`` / ``param`` / ``blob_share_mode`` → ``param`` specs, parameters copied;
4. inputs (UpgradeNetInput): ``input`` + ``input_shape`` or ``input_dim`` → one Input layer,
   placed first;
5. BatchNorm (UpgradeNetBatchNorm): a BatchNorm layer with 3 ``param`` specs keeps them with
   ``lr_mult`` and ``decay_mult`` set to 0.

and UpgradeSolverAsNeeded (``solver_type`` enum → ``type`` string). Inputs are never mutated.
Where Caffe aborts, or reports that the upgrade had problems and silently drops part of the
definition, PrototxtError (nets) or SolverError (solvers) is raised instead.
"""

from __future__ import annotations

from google.protobuf import text_format

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import PrototxtError, SolverError
from caffe2jax.frontend.forks.upgrade import (
    FORK_V1_PARAMS,
    FORK_V1_TYPES,
    needs_fork_upgrade,
    upgrade_fork_layers,
    v1_layer_extras,
)
from caffe2jax.frontend.upgrade_v0 import net_needs_v0_upgrade, upgrade_v0_net

V1 = caffe_pb2.V1LayerParameter

#: V1LayerType enum name → current layer type string (Caffe's UpgradeV1LayerType).
V1_LAYER_TYPES: dict[str, str] = {
    "NONE": "",
    "ABSVAL": "AbsVal",
    "ACCURACY": "Accuracy",
    "ARGMAX": "ArgMax",
    "BNLL": "BNLL",
    "CONCAT": "Concat",
    "CONTRASTIVE_LOSS": "ContrastiveLoss",
    "CONVOLUTION": "Convolution",
    "DECONVOLUTION": "Deconvolution",
    "DATA": "Data",
    "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData",
    "EUCLIDEAN_LOSS": "EuclideanLoss",
    "ELTWISE": "Eltwise",
    "EXP": "Exp",
    "FLATTEN": "Flatten",
    "HDF5_DATA": "HDF5Data",
    "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss",
    "IM2COL": "Im2col",
    "IMAGE_DATA": "ImageData",
    "INFOGAIN_LOSS": "InfogainLoss",
    "INNER_PRODUCT": "InnerProduct",
    "LRN": "LRN",
    "MEMORY_DATA": "MemoryData",
    "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN",
    "POOLING": "Pooling",
    "POWER": "Power",
    "RELU": "ReLU",
    "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss",
    "SILENCE": "Silence",
    "SOFTMAX": "Softmax",
    "SOFTMAX_LOSS": "SoftmaxWithLoss",
    "SPLIT": "Split",
    "SLICE": "Slice",
    "TANH": "TanH",
    "WINDOW_DATA": "WindowData",
    "THRESHOLD": "Threshold",
    **FORK_V1_TYPES,  # DeepLab v1, C3D v1.0, eric612 (frontend/forks/upgrade.py)
}

#: The V1 parameter messages UpgradeV1LayerParameter copies to the same-named current field.
V1_COPIED_PARAMS: tuple[str, ...] = tuple(
    f"{kind}_param"
    for kind in (
        "accuracy argmax concat contrastive_loss convolution data dropout dummy_data eltwise exp "
        "hdf5_data hdf5_output hinge_loss image_data infogain_loss inner_product lrn memory_data "
        "mvn pooling power relu sigmoid softmax slice tanh threshold window_data transform loss"
    ).split()
) + FORK_V1_PARAMS  # fmt: skip

#: V1 data layer type → its parameter message holding deprecated transformation fields.
_DATA_LAYER_PARAMS = {
    V1.DATA: "data_param",
    V1.IMAGE_DATA: "image_data_param",
    V1.WINDOW_DATA: "window_data_param",
}
_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")

#: SolverParameter.SolverType enum name → solver type string (Caffe's UpgradeSolverType).
SOLVER_TYPES: dict[str, str] = {
    "SGD": "SGD",
    "NESTEROV": "Nesterov",
    "ADAGRAD": "AdaGrad",
    "RMSPROP": "RMSProp",
    "ADADELTA": "AdaDelta",
    "ADAM": "Adam",
}

_INLINE_NETS = ("net_param", "train_net_param", "test_net_param")


# --------------------------------------------------------------------------------------------
# Nets


def net_needs_upgrade(net: caffe_pb2.NetParameter) -> bool:
    """Caffe's NetNeedsUpgrade: V0 or V1 layers, old data fields, net inputs or old BatchNorm."""
    return (
        net_needs_v0_upgrade(net)
        or _needs_v1_upgrade(net)
        or _needs_data_upgrade(net)
        or _needs_input_upgrade(net)
        or _needs_batch_norm_upgrade(net)
        or needs_fork_upgrade(net)
    )


def upgrade_net(
    net: caffe_pb2.NetParameter, source: str = "", text: str = ""
) -> caffe_pb2.NetParameter:
    """Caffe's UpgradeNetAsNeeded on a copy of ``net``, then the forks' deprecated forms
    (:mod:`~caffe2jax.frontend.forks.upgrade`); ``source`` and ``text`` locate errors."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(net)
    if out.layers and out.layer:
        raise _mixed_versions(out, source)
    if net_needs_v0_upgrade(out):
        out = upgrade_v0_net(out, source)
    if _needs_data_upgrade(out):
        _upgrade_data_transformation(out)
    if _needs_v1_upgrade(out):
        out = _upgrade_v1_net(out)
    upgrade_fork_layers(out, source, text)
    if _needs_input_upgrade(out):
        _upgrade_input(out, source)
    if _needs_batch_norm_upgrade(out):
        _upgrade_batch_norm(out)
    return out


def _mixed_versions(net: caffe_pb2.NetParameter, source: str) -> PrototxtError:
    """UpgradeV1Net drops every ``layer`` entry of a net that also has ``layers``: refuse."""
    first = net.layer[0].name or "unnamed"
    old = net.layers[0]
    old_name = old.layer.name if old.HasField("layer") else old.name
    return PrototxtError(
        f"{source or '<net>'}: the net mixes current 'layer' entries (first: '{first}') with "
        f"deprecated 'layers' entries (first: '{old_name or 'unnamed'}'); Caffe's upgrade would "
        "drop the 'layer' entries, so write every layer in one format"
    )


def _needs_v1_upgrade(net: caffe_pb2.NetParameter) -> bool:
    """Caffe's NetNeedsV1ToV2Upgrade: the net has ``layers`` entries."""
    return len(net.layers) > 0


def _needs_data_upgrade(net: caffe_pb2.NetParameter) -> bool:
    """Caffe's NetNeedsDataUpgrade: a V1 data layer sets a transformation field in its param."""
    for layer in net.layers:
        param_name = _DATA_LAYER_PARAMS.get(layer.type)
        if param_name is None:
            continue
        param = getattr(layer, param_name)
        if any(param.HasField(name) for name in _TRANSFORM_FIELDS):
            return True
    return False


def _upgrade_data_transformation(net: caffe_pb2.NetParameter) -> None:
    """Caffe's UpgradeNetDataTransformation, in place on V1 ``layers``.

    As in Caffe (whose mutable_*() accessors mark messages present), every DATA / IMAGE_DATA /
    WINDOW_DATA layer ends with both its data parameter and ``transform_param`` present, even
    when empty.
    """
    for layer in net.layers:
        param_name = _DATA_LAYER_PARAMS.get(layer.type)
        if param_name is None:
            continue
        param = getattr(layer, param_name)
        param.SetInParent()
        layer.transform_param.SetInParent()
        for name in _TRANSFORM_FIELDS:
            if param.HasField(name):
                setattr(layer.transform_param, name, getattr(param, name))
                param.ClearField(name)


def _upgrade_v1_net(net: caffe_pb2.NetParameter) -> caffe_pb2.NetParameter:
    """Caffe's UpgradeV1Net: every net field kept, ``layers`` replaced by ``layer``."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(net)
    out.ClearField("layers")
    out.ClearField("layer")
    for v1_layer in net.layers:
        out.layer.append(upgrade_v1_layer(v1_layer))
    return out


def upgrade_v1_layer(v1: caffe_pb2.V1LayerParameter) -> caffe_pb2.LayerParameter:
    """Caffe's UpgradeV1LayerParameter for one V1 layer (without a V0 ``layer``)."""
    out = caffe_pb2.LayerParameter()
    out.bottom.extend(v1.bottom)
    out.top.extend(v1.top)
    if v1.HasField("name"):
        out.name = v1.name
    out.include.extend(v1.include)
    out.exclude.extend(v1.exclude)
    if v1.HasField("type"):
        out.type = V1_LAYER_TYPES[V1.LayerType.Name(v1.type)]
    out.blobs.extend(v1.blobs)
    _upgrade_param_specs(v1, out)
    out.loss_weight.extend(v1.loss_weight)
    for name in V1_COPIED_PARAMS:
        if v1.HasField(name):
            getattr(out, name).CopyFrom(getattr(v1, name))
    v1_layer_extras(v1, out)
    return out


def _upgrade_param_specs(v1: caffe_pb2.V1LayerParameter, out: caffe_pb2.LayerParameter) -> None:
    """V1 ``param`` names, ``blob_share_mode``, ``blobs_lr``, ``weight_decay`` → ParamSpecs.

    The i-th entry of each list fills the i-th ParamSpec; there are as many specs as the
    longest list, as in Caffe.
    """
    count = max(len(v1.param), len(v1.blob_share_mode), len(v1.blobs_lr), len(v1.weight_decay))
    for _ in range(count):
        out.param.add()
    for spec, name in zip(out.param, v1.param):
        spec.name = name
    for spec, mode in zip(out.param, v1.blob_share_mode):
        spec.share_mode = caffe_pb2.ParamSpec.DimCheckMode.Value(V1.DimCheckMode.Name(mode))
    for spec, lr_mult in zip(out.param, v1.blobs_lr):
        spec.lr_mult = lr_mult
    for spec, decay_mult in zip(out.param, v1.weight_decay):
        spec.decay_mult = decay_mult


def _needs_input_upgrade(net: caffe_pb2.NetParameter) -> bool:
    """Caffe's NetNeedsInputUpgrade: the net lists ``input`` blobs."""
    return len(net.input) > 0


def _upgrade_input(net: caffe_pb2.NetParameter, source: str) -> None:
    """Caffe's UpgradeNetInput, in place: one Input layer named "input", moved to the front.

    ``input_shape`` wins over ``input_dim`` when both are given; inputs with neither (legacy
    caffemodels) are simply removed. Counts that do not match the inputs are refused (Caffe
    would read past the end of the list).
    """
    shapes = _input_shapes(net, source)
    if shapes is not None:
        layer = caffe_pb2.LayerParameter(name="input", type="Input")
        layer.top.extend(net.input)
        layer.input_param.shape.extend(shapes)
        layers = [layer, *net.layer]
        del net.layer[:]
        net.layer.extend(layers)
    net.ClearField("input")
    net.ClearField("input_shape")
    net.ClearField("input_dim")


def _input_shapes(net: caffe_pb2.NetParameter, source: str) -> list[caffe_pb2.BlobShape] | None:
    """One BlobShape per input from ``input_shape`` or 4 ``input_dim`` each; None if neither."""
    inputs = list(net.input)
    where = f"{source or '<net>'}: net inputs {inputs}"
    if net.input_shape:
        if len(net.input_shape) != len(inputs):
            count = len(net.input_shape)
            raise PrototxtError(f"{where}: {count} input_shape entries, expected one per input")
        return list(net.input_shape)
    if net.input_dim:
        dims = list(net.input_dim)
        if len(dims) != 4 * len(inputs):
            raise PrototxtError(
                f"{where}: {len(dims)} input_dim values, expected 4 per input "
                f"({4 * len(inputs)}); Caffe reads input_dim as N, C, H, W for each input"
            )
        return [caffe_pb2.BlobShape(dim=dims[4 * i : 4 * i + 4]) for i in range(len(inputs))]
    return None


def _needs_batch_norm_upgrade(net: caffe_pb2.NetParameter) -> bool:
    """Caffe's NetNeedsBatchNormUpgrade (a BatchNorm layer declares exactly 3 param specs),
    false once those specs all hold lr_mult and decay_mult explicitly 0.

    Caffe's own check stays true after its upgrade; this one makes net_needs_upgrade(net)
    mean exactly "upgrade_net changes net".
    """
    return any(_old_batch_norm(layer) for layer in net.layer)


def _old_batch_norm(layer: caffe_pb2.LayerParameter) -> bool:
    if layer.type != "BatchNorm" or len(layer.param) != 3:
        return False
    return not all(_frozen(spec) for spec in layer.param)


def _frozen(spec: caffe_pb2.ParamSpec) -> bool:
    fields = ("lr_mult", "decay_mult")
    return all(spec.HasField(name) and getattr(spec, name) == 0 for name in fields)


def _upgrade_batch_norm(net: caffe_pb2.NetParameter) -> None:
    """Caffe's UpgradeNetBatchNorm: such layers keep their specs, with lr_mult = decay_mult = 0."""
    for layer in net.layer:
        if layer.type == "BatchNorm" and len(layer.param) == 3:
            for spec in layer.param:
                spec.lr_mult = 0.0
                spec.decay_mult = 0.0


# --------------------------------------------------------------------------------------------
# Solvers


def solver_needs_upgrade(solver: caffe_pb2.SolverParameter, *, nets: bool = False) -> bool:
    """Caffe's SolverNeedsTypeUpgrade (``solver_type`` is set); with ``nets``, inline nets too."""
    if solver.HasField("solver_type"):
        return True
    return nets and any(net_needs_upgrade(net) for net in _inline_nets(solver))


def upgrade_solver(
    solver: caffe_pb2.SolverParameter, source: str = "", *, nets: bool = False
) -> caffe_pb2.SolverParameter:
    """Caffe's UpgradeSolverAsNeeded on a copy: ``solver_type`` enum → ``type`` string.

    Caffe refuses a solver that sets both fields, even when they agree. Caffe never upgrades
    the nets given inline (``net_param``, ``train_net_param``, ``test_net_param``); with
    ``nets=True`` they are upgraded too, as upgrade_net would upgrade them from a file.
    """
    out = caffe_pb2.SolverParameter()
    out.CopyFrom(solver)
    if out.HasField("solver_type"):
        enum_name = caffe_pb2.SolverParameter.SolverType.Name(out.solver_type)
        if out.HasField("type"):
            raise SolverError(
                f"{source or '<solver>'}: both the deprecated 'solver_type: {enum_name}' and "
                f"'type: \"{out.type}\"' are set; Caffe refuses this, keep only 'type'"
            )
        out.type = SOLVER_TYPES[enum_name]
        out.ClearField("solver_type")
    if nets:
        _upgrade_inline_nets(out, source)
    return out


def _inline_nets(solver: caffe_pb2.SolverParameter) -> list[caffe_pb2.NetParameter]:
    found = [solver.net_param] if solver.HasField("net_param") else []
    if solver.HasField("train_net_param"):
        found.append(solver.train_net_param)
    return found + list(solver.test_net_param)


def _upgrade_inline_nets(solver: caffe_pb2.SolverParameter, source: str) -> None:
    """Replace each inline net of ``solver`` (a copy we own) by its upgraded form."""
    where = source or "<solver>"
    for name in ("net_param", "train_net_param"):
        if solver.HasField(name):
            upgraded = upgrade_net(getattr(solver, name), f"{where} ({name})")
            getattr(solver, name).CopyFrom(upgraded)
    for i, net in enumerate(solver.test_net_param):
        net.CopyFrom(upgrade_net(net, f"{where} (test_net_param {i})"))


# --------------------------------------------------------------------------------------------
# Text


def upgraded_text(
    net_or_solver: caffe_pb2.NetParameter | caffe_pb2.SolverParameter, source: str = ""
) -> str:
    """The upgraded message as prototxt text (what ``caffe2jax upgrade IN OUT`` writes).

    Nets go through upgrade_net; solvers through upgrade_solver with their inline nets.
    """
    if isinstance(net_or_solver, caffe_pb2.NetParameter):
        upgraded = upgrade_net(net_or_solver, source)
    elif isinstance(net_or_solver, caffe_pb2.SolverParameter):
        upgraded = upgrade_solver(net_or_solver, source, nets=True)
    else:
        raise TypeError(f"expected a NetParameter or SolverParameter, got {type(net_or_solver)}")
    return text_format.MessageToString(upgraded)
