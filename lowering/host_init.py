"""Caffe's fillers on the host: a net's params and state without compiling the net's init.

:meth:`Graph.init <caffe2jax.lowering.graph.Graph.init>` draws every random filler from two
shared sample pools (:class:`caffe2jax.lowering.fillers.Draws`) inside one compiled program,
whose compile grows with the net (seconds for GoogLeNet). Here only the two pools are drawn by
a small compiled program (the same samples) and each filler's arithmetic runs in numpy, so
values equal the traced path's to float rounding (XLA may fuse a multiply-add: ≤ 1 ulp);
constant fillers cost nothing, and no program depends on the net's layers.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import jax
import numpy as np

from caffe2jax.lowering.fillers import Draws, draws_needed, fill
from caffe2jax.lowering.graph import Graph, Params
from caffe2jax.lowering.registry import NetState


@partial(jax.jit, static_argnums=(1, 2, 3))
def _pools(key: jax.Array, normals: int, uniforms: int, dtype: Any) -> tuple:
    """The pools :class:`Draws` draws (same keys, same order)."""
    k_normal, k_uniform = jax.random.split(key)
    normal = jax.random.normal(k_normal, (normals,), dtype) if normals else None
    uniform = jax.random.uniform(k_uniform, (uniforms,), dtype) if uniforms else None
    return normal, uniform


class _HostDraws(Draws):
    """:class:`Draws` over numpy copies of the pools."""

    def __init__(self, normal: np.ndarray | None, uniform: np.ndarray | None):
        self._pools = {"normal": normal, "uniform": uniform}
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
    normals, uniforms = sum(n for n, _ in needs), sum(u for _, u in needs)
    pools = _pools(key, normals, uniforms, dtype) if normals or uniforms else (None, None)
    draws = _HostDraws(*(None if p is None else np.asarray(p) for p in pools))
    params: Params = {}
    state: Params = {}
    for name, j, decl in owned:
        tree = state if decl.state else params
        blobs = tree.setdefault(name, [None] * len(graph.decls[name]))
        blobs[j] = _host_fill(decl.filler, tuple(decl.shape), draws, dtype)
    carry = {name: [np.zeros(d.shape, dtype) for d in decls]
             for name, decls in graph.carries.items()}  # fmt: skip
    return jax.device_put(params), NetState(jax.device_put(state), jax.device_put(carry))
