"""Caffe's fillers run on the host: a net's params and state with nothing to compile
(:meth:`Model.init <caffe2jax.lowering.model.Model.init>`'s default path)."""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from caffe2jax.lowering.fillers import Draws, draws_needed, fill
from caffe2jax.lowering.graph import Graph, Params
from caffe2jax.lowering.registry import NetState

__all__ = ["host_init"]


# Caffe's fillers on the host: a net's params and state with nothing to compile.
#
# :meth:`Graph.init <caffe2jax.lowering.graph.Graph.init>` draws every random filler from two
# shared sample pools (:class:`caffe2jax.lowering.fillers.Draws`) inside one compiled program,
# whose compile grows with the net (seconds for GoogLeNet) and whose threefry draws are slow on
# a CPU (seconds for ResNet-152's 60 M weights). Here the same fillers (the same formulas, code
# and checks) draw their two pools from NumPy's generator seeded by the key, and run in NumPy:
# the same distributions, other samples (Caffe's own RNG is not reproduced by either; its
# constant and bilinear fillers are exact in both).


class _HostDraws(Draws):
    """:class:`Draws` whose pools are NumPy's: standard normals and U[0, 1), float32 (or the
    net's float dtype), from a generator seeded by the JAX key's data."""

    def __init__(self, key: jax.Array, normals: int, uniforms: int, dtype: np.dtype):
        rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
        kind = dtype if dtype in (np.float32, np.float64) else np.dtype(np.float32)
        self._pools = {
            "normal": rng.standard_normal(normals, dtype=kind).astype(dtype, copy=False),
            "uniform": rng.random(uniforms, dtype=kind).astype(dtype, copy=False),
        }
        self._used = {"normal": 0, "uniform": 0}


def _host_fill(filler: Any, shape: tuple[int, ...], draws: Draws, dtype: np.dtype) -> Any:
    if filler is None:
        return np.zeros(shape, dtype)
    if filler.type == "constant" and filler.sparse == -1:
        return np.full(shape, filler.value, dtype)
    if not math.prod(shape):
        return np.zeros(shape, dtype)
    return fill(filler, shape, draws, dtype)  # checks the filler as the traced path does


def host_init(graph: Graph, key: jax.Array) -> tuple[Params, NetState]:
    """Params and state from each owned blob's filler, as ``graph.init(key)`` gives them
    (shared slots hold None), drawn on the host; values on the default device."""
    dtype = np.dtype(graph.dtype)
    owned = graph.owned()
    needs = [draws_needed(decl.filler, decl.shape) for _, _, decl in owned]
    draws = _HostDraws(key, sum(n for n, _ in needs), sum(u for _, u in needs), dtype)
    params: Params = {}
    state: Params = {}
    for name, j, decl in owned:
        tree = state if decl.state else params
        blobs = tree.setdefault(name, [None] * len(graph.decls[name]))
        blobs[j] = _host_fill(decl.filler, tuple(decl.shape), draws, dtype)
    carry = {name: [np.zeros(d.shape, dtype) for d in decls]
             for name, decls in graph.carries.items()}  # fmt: skip
    return jax.device_put(params), NetState(jax.device_put(state), jax.device_put(carry))
