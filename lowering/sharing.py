"""Shared params: Caffe's AppendParam ownership rule and the checks it makes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from caffe2jax.frontend import ir
from caffe2jax.lowering.registry import ParamDecl
from caffe2jax.lowering.util import fail

Slot = tuple[str, int]  # (layer name, blob index)


def resolve_sharing(net: ir.Net, decls: Mapping[str, Sequence[ParamDecl]]) -> dict[Slot, Slot]:
    """Caffe's AppendParam: the first layer naming a param owns it; later ones share it.
    Returns each sharing slot's owner slot; refuses what Caffe refuses (shared state blobs,
    shapes that differ — counts with ``share_mode: PERMISSIVE`` —, mismatched multipliers)."""
    owners: dict[str, Slot] = {}
    shared: dict[Slot, Slot] = {}
    for layer in net.layers:
        for j, decl in enumerate(decls.get(layer.name, [])):
            spec = layer.spec(j)
            if not spec.name:
                continue
            if spec.name not in owners:
                owners[spec.name] = (layer.name, j)
                continue
            owner, oj = owners[spec.name]
            theirs = decls[owner][oj]
            if decl.state or theirs.state:
                raise fail(layer, f"param '{spec.name}' is a state blob and cannot be shared")
            same = (
                np.prod(decl.shape) == np.prod(theirs.shape)
                if spec.permissive
                else decl.shape == theirs.shape
            )
            if not same:
                raise fail(
                    layer,
                    f"cannot share param '{spec.name}' owned by layer '{owner}': owner shape "
                    f"{list(theirs.shape)}, this layer's shape {list(decl.shape)}"
                    + (" (count mismatch)" if spec.permissive else ""),
                )
            _check_mults(layer, spec, net.layer(owner).spec(oj))
            shared[(layer.name, j)] = (owner, oj)
    return shared


def _check_mults(layer: ir.Layer, spec: ir.ParamSpec, owner: ir.ParamSpec) -> None:
    for field in ("lr_mult", "decay_mult"):
        mine, theirs = getattr(spec, field), getattr(owner, field)
        if getattr(spec, f"has_{field}") and getattr(owner, f"has_{field}") and mine != theirs:
            raise fail(layer, f"shared param '{spec.name}' has mismatched {field}")
