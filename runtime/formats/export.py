"""A net's forward pass as a serialized StableHLO module (``jax.export``), and its loader.

The exported function takes one dict ``{input blob: array}`` (shapes and dtype fixed at export)
and returns ``{output blob: array}`` for the net's outputs (the blobs no layer consumes, as
Caffe's ``net.outputs``). Weights are baked in as constants, so the file alone is the model::

    from jax import export
    forward = export.deserialize(bytearray(open("lenet.jaxexport", "rb").read()))
    outputs = forward.call({"data": images})          # {"prob": ...}

or ``caffe2jax.runtime.formats.export.load_exported(path).call(...)``. Any JAX of the same or a
newer version runs it, without caffe2jax, on the platforms it was lowered for.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
from jax import export

from caffe2jax.frontend.errors import CaffeError
from caffe2jax.runtime.formats.atomic import atomic_write

if TYPE_CHECKING:
    from caffe2jax.lowering.graph import Params
    from caffe2jax.lowering.model import Model


def serializable(model: Model) -> Model:
    """``model`` under an engine policy whose program serializes: XLA's own convolutions.

    On the CPU the default policy runs large convolutions through oneDNN, a foreign call
    (``caffe2jax_onednn_fwd``) that a serialized module cannot carry; the exported forward
    computes the same layers with XLA's kernels instead (the same numbers, to float rounding:
    every engine is tested against the plain form)."""
    policy = model.policy
    if policy.conv == "xla":
        return model
    from caffe2jax.lowering.model import Model

    xla = dataclasses.replace(policy, conv="xla")
    return Model(model.net, model.inputs, model.dtype, model.graph.precision, policy=xla)


def export_forward(
    model: Model,
    params: Params,
    state: Params,
    *,
    platforms: Sequence[str] | None = None,
) -> export.Exported:
    """``jax.export`` of ``inputs -> outputs`` for ``model`` with these weights.

    ``platforms`` (e.g. ``("cpu", "cuda")``) lowers for several backends at once; the default
    is the backend JAX runs on here. The forward uses no randomness (``rng=None``): export a
    TEST-phase model. It is traced under :func:`serializable`'s engine policy; a net whose
    program still holds a host callback (a class-style Python layer) is refused in one line.
    """
    model = serializable(model)
    outputs = model.outputs

    def forward(inputs: dict[str, jax.Array]) -> dict[str, jax.Array]:
        blobs, _ = model.apply(params, state, inputs)
        return {name: blobs[name] for name in outputs}

    specs = {name: jax.ShapeDtypeStruct(shape, model.dtype) for name, shape in model.inputs.items()}
    try:
        return export.export(jax.jit(forward), platforms=platforms)(specs)
    except ValueError as err:
        if "custom call" not in str(err).lower():
            raise
        first = str(err).strip().splitlines()[0][:200]
        raise CaffeError(
            f"net '{model.net.name}' cannot be serialized: its program calls out of XLA "
            f"(a Python layer's host callback?): {first}"
        ) from None


def save_exported(
    path: str | os.PathLike, exported: export.Exported, *, overwrite: bool = True
) -> Path:
    """Write ``exported.serialize()`` atomically (an existing file only if ``overwrite``)."""
    return atomic_write(path, bytes(exported.serialize()), overwrite=overwrite)


def load_exported(path: str | os.PathLike) -> export.Exported:
    """Read a module written by ``caffe2jax export``; call it with ``.call({name: array})``."""
    data = Path(path).read_bytes()
    try:
        return export.deserialize(bytearray(data))
    except Exception as err:  # flatbuffers/version errors have no common base class
        raise CaffeError(f"{path}: not a serialized jax.export module ({err})") from None


def describe(exported: export.Exported) -> dict[str, Any]:
    """Input and output names with their shapes, for printing."""
    inputs = jax.tree_util.tree_unflatten(exported.in_tree, exported.in_avals)[0][0]
    outputs = jax.tree_util.tree_unflatten(exported.out_tree, exported.out_avals)
    return {
        "inputs": {k: tuple(v.shape) for k, v in inputs.items()},
        "outputs": {k: tuple(v.shape) for k, v in outputs.items()},
        "platforms": tuple(exported.platforms),
    }
