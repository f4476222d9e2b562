"""Filtered NetParameter → ir.Net: SSA blobs, param specs, loss weights, wiring checks.

Reproduces the bookkeeping of Caffe's Net::Init (AppendBottom / AppendTop): bottoms must be
produced earlier, a top may only be rewritten in place (``top[i] == bottom[i]``), loss layers
weigh their first top 1 by default, and ``propagate_down`` is empty or one flag per bottom.
"""

from __future__ import annotations

import re
from types import MappingProxyType

from caffe2jax.frontend import caffe_pb2, ir
from caffe2jax.frontend.errors import NetError
from caffe2jax.frontend.forks.coord_maps import with_auto_crop_offsets
from caffe2jax.frontend.forks.dialect import Dialect
from caffe2jax.frontend.forks.forms import layer_form
from caffe2jax.frontend.forks.layer_types import NO_DEFAULT_LOSS_WEIGHT


def _layer_lines(text: str) -> dict[str, int]:
    """Line of each ``name: "..."`` (or ``name: '...'``: text format takes either quote, and
    py-faster-rcnn's and PVANet's nets use single ones) in the source, the best anchor for a
    layer's errors."""
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        match = re.search(r"""\bname\s*:\s*(?:"([^"]*)"|'([^']*)')""", line)
        if match and (match.group(1) or match.group(2) or "") not in lines:
            lines[match.group(1) or match.group(2) or ""] = number
    return lines


def auto_tops(param: caffe_pb2.LayerParameter) -> list[str]:
    """The layer's tops; a loss layer with none gets one anonymous top, as Caffe's Net::Init
    does for layers whose AutoTopBlobs() is true (every LossLayer)."""
    if not param.top and param.type.endswith("Loss"):
        return [f"{param.name}(automatic)"]
    return list(param.top)


def default_loss_weights(param: caffe_pb2.LayerParameter) -> tuple[float, ...]:
    """Caffe's loss weights: as given (one per top), else 1 for a loss layer's first top.

    Every BVLC loss layer derives from LossLayer and is named ``*Loss``; LossLayer::LayerSetUp
    adds ``loss_weight: 1`` when none is given, which weighs only the first top (not for the
    fork types whose LayerSetUp skips it: ``NO_DEFAULT_LOSS_WEIGHT``).
    """
    n_tops = len(auto_tops(param))
    if param.loss_weight:
        return tuple(float(w) for w in param.loss_weight)
    if param.type.endswith("Loss") and n_tops and param.type not in NO_DEFAULT_LOSS_WEIGHT:
        return (1.0,) + (0.0,) * (n_tops - 1)
    return (0.0,) * n_tops


def _param_specs(param: caffe_pb2.LayerParameter) -> tuple[ir.ParamSpec, ...]:
    return tuple(
        ir.ParamSpec(
            name=spec.name,
            lr_mult=spec.lr_mult,
            decay_mult=spec.decay_mult,
            permissive=spec.share_mode == caffe_pb2.ParamSpec.PERMISSIVE,
            has_lr_mult=spec.HasField("lr_mult"),
            has_decay_mult=spec.HasField("decay_mult"),
        )
        for spec in param.param
    )


class _Builder:
    def __init__(self, source: str, text: str, dialect: Dialect):
        self.source = source
        self.dialect = dialect
        self.lines = _layer_lines(text) if text else {}
        self.current: dict[str, str] = {}  # user name → SSA id of its latest version
        self.first: dict[str, str] = {}  # user name → SSA id of its first version
        self.writes: dict[str, int] = {}  # user name → number of writers so far

    def fail(self, param: caffe_pb2.LayerParameter, problem: str) -> NetError:
        line = self.lines.get(param.name)
        where = f"{self.source}:{line}: " if self.source and line else ""
        return NetError(f"{where}layer '{param.name}' (type {param.type}): {problem}")

    def layer(self, param: caffe_pb2.LayerParameter, name: str) -> ir.Layer:
        top_names = auto_tops(param)
        if param.propagate_down and len(param.propagate_down) != len(param.bottom):
            raise self.fail(
                param,
                f"propagate_down has {len(param.propagate_down)} entries; give none or one "
                f"per bottom ({len(param.bottom)})",
            )
        if param.loss_weight and len(param.loss_weight) != len(top_names):
            raise self.fail(
                param,
                f"loss_weight has {len(param.loss_weight)} entries; give none or one per top "
                f"({len(top_names)})",
            )
        bottoms = []
        for i, bottom in enumerate(param.bottom):
            if bottom not in self.current:
                raise self.fail(param, f"unknown bottom blob '{bottom}' (bottom index {i})")
            bottoms.append(self.current[bottom])
        tops = []
        for i, top in enumerate(top_names):
            in_place = i < len(param.bottom) and param.bottom[i] == top
            if top in self.current and not in_place:
                raise self.fail(param, f"top blob '{top}' is produced by multiple sources")
            if top in top_names[:i]:
                raise self.fail(param, f"top blob '{top}' appears twice")
            tops.append(self._version(top, name))
        try:
            form = layer_form(param, self.dialect)
        except ValueError as err:
            raise self.fail(param, str(err)) from None
        return ir.Layer(
            name=name,
            type=param.type,
            bottoms=tuple(bottoms),
            tops=tuple(tops),
            bottom_names=tuple(param.bottom),
            top_names=tuple(top_names),
            loss_weights=default_loss_weights(param),
            propagate_down=tuple(bool(p) for p in param.propagate_down),
            param_specs=_param_specs(param),
            param=param,
            line=self.lines.get(param.name, 0),
            source=self.source,
            form=form,
        )

    def _version(self, name: str, writer: str) -> str:
        """A provisional SSA id; the last version is renamed to the user name in finish()."""
        count = self.writes.get(name, 0)
        self.writes[name] = count + 1
        ssa = f"{name}@{writer}"
        self.current[name] = ssa
        self.first.setdefault(name, ssa)
        return ssa


def _rename_last_versions(layers: list[ir.Layer], current: dict[str, str]) -> dict[str, str]:
    """Map each blob's last SSA id to the plain user name (what Caffe shows for that blob).

    Earlier versions keep their ``<blob>@<writer>`` id; a user blob literally named like one
    of those would be ambiguous and is refused.
    """
    rename = {ssa: user for user, ssa in current.items()}
    earlier = {t for layer in layers for t in layer.tops} - set(rename)
    clash = sorted(earlier & set(current))
    if clash:
        raise NetError(f"blob name '{clash[0]}' clashes with an in-place version of another blob")
    return rename


def _unique_names(net: caffe_pb2.NetParameter) -> list[str]:
    """Layer names as keys: Caffe tolerates duplicates (its own mnist_autoencoder has two
    layers named "loss"); the k-th repeat of a name is keyed ``name#k`` here, while
    ``layer.param.name`` keeps the user's name for the files we write."""
    seen: dict[str, int] = {}
    names = []
    for param in net.layer:
        seen[param.name] = seen.get(param.name, 0) + 1
        names.append(param.name if seen[param.name] == 1 else f"{param.name}#{seen[param.name]}")
    return names


def build_net(
    net: caffe_pb2.NetParameter,
    *,
    source: str = "",
    text: str = "",
    dialect: Dialect | None = None,
) -> ir.Net:
    """Build the IR of an upgraded, filtered NetParameter.

    ``source`` (a file name) and ``text`` (its contents) only improve error messages;
    ``dialect`` (default BVLC) decides the forms the text alone leaves open.
    """
    dialect = dialect or Dialect()
    builder = _Builder(source, text, dialect)
    hed = not (dialect.given and dialect.key == "bvlc")  # a bare Crop: HED's unless told BVLC
    params = with_auto_crop_offsets(net.layer, builder.fail, hed)  # RCF's AutoCrop, HED's Crop
    layers = [builder.layer(param, name) for param, name in zip(params, _unique_names(net))]
    rename = _rename_last_versions(layers, builder.current)

    def ssa(name: str) -> str:
        return rename.get(name, name)

    layers = [
        ir.Layer(
            **{
                **{f: getattr(layer, f) for f in ir.Layer.__dataclass_fields__},
                "bottoms": tuple(ssa(b) for b in layer.bottoms),
                "tops": tuple(ssa(t) for t in layer.tops),
            }
        )
        for layer in layers
    ]
    state = net.state
    return ir.Net(
        name=net.name,
        phase="TRAIN" if state.phase == caffe_pb2.TRAIN else "TEST",
        level=state.level,
        stages=tuple(state.stage),
        layers=tuple(layers),
        force_backward=net.force_backward,
        blob_names=MappingProxyType({u: ssa(s) for u, s in builder.current.items()}),
        first_version=MappingProxyType({u: ssa(s) for u, s in builder.first.items()}),
        source=source,
        param=net,
        dialect=dialect.key,
    )
