"""Convolution weights packed once for forward-only programs (what ONNX Runtime does with its
constant initializers).

A oneDNN convolution (onednn.py) takes Caffe-layout weights (O, C/group, kh, kw) and reorders
them into its primitive's blocked format on every call: 39 % of oneDNN's time in GoogLeNet's
batch-1 forward (docs/performance.md). A program that only runs forward (pycaffe's
``Net.forward``, ``Model.apply`` on ``Model.packed``'s tree) can instead take each such weight
already packed: :class:`Packer` reorders it on the host, once per weight array, and hands the
forward a params tree in which those slots hold :class:`PackedWeights`; the convolution then
runs the same primitive on them (``fwd_packed``), bit for bit the result of the unpacked call.

Never stale: a slot is packed again whenever the array in it is not the very ``jax.Array``
object it was packed from (jax arrays are immutable; a numpy array, which a caller may write
in place, is packed on every call). Which primitive each weight is packed for comes from the
plan (the convolution's bottom shape, parameters and layout); a weight that convolutions of
several geometries read (shared params) stays unpacked, and packed weights reaching another
geometry fail loudly at trace time.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

from caffe2jax.lowering.engines import folding, fused, onednn, winograd

Slot = tuple[str, int]  # (layer owning the param, blob index)


@jax.tree_util.register_pytree_node_class
class PackedWeights:
    """One convolution's weights as a forward-only program takes them: ``data`` the flat
    array packed on the host (``onednn.primitives(key).pack``) for the geometry ``key``
    names, from the weights of ``slot``, whose Caffe shape is ``shape``."""

    def __init__(self, data: Any, slot: Slot, shape: tuple[int, ...], key: bytes):
        self.data, self.slot, self.shape, self.key = data, slot, tuple(shape), key

    def tree_flatten(self):
        return (self.data,), (self.slot, self.shape, self.key)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], *aux)

    def __repr__(self) -> str:
        return f"PackedWeights({self.slot}, {self.shape}, {self.key.decode()})"


def _aux_bytes(aux: tuple) -> bytes:
    slot, shape, key = aux
    return json.dumps([list(slot), list(shape), key.decode()]).encode()


def _aux_from(data: bytes) -> tuple:
    slot, shape, key = json.loads(data)
    return tuple(slot), tuple(shape), key.encode()


# an exported forward (runtime/host/startup_cache.py) keeps a packed tree's structure
with contextlib.suppress(ValueError):  # registered already (the module loaded twice)
    jax.export.register_pytree_node_serialization(
        PackedWeights, serialized_name="caffe2jax.PackedWeights",
        serialize_auxdata=_aux_bytes, deserialize_auxdata=_aux_from,
    )  # fmt: skip


def convolve(g: onednn.Geometry, x: jax.Array, w: PackedWeights) -> jax.Array:
    """The oneDNN convolution ``g`` of ``x`` with weights packed for it (``fwd_packed``), or
    Winograd's F(2×2, 3×3) where they were packed for that (winograd.py)."""
    if winograd.is_winograd(w.key) and winograd.geometry_of(w.key) == g.key():
        return winograd.convolve(x, w.data)
    if w.key != g.key():
        raise ValueError(f"weights of {w.slot} were packed for the convolution {w.key!r}, "
                         f"not {g.key()!r}: pack them with this model's Packer")  # fmt: skip
    return onednn.call("fwd_packed", g, g.shaped(g.y), x, w.data)


class Packer:
    """Packs the weights of a planned net's oneDNN convolutions for its forward-only programs.

    ``keys``: (layer, blob) → the geometry key of the oneDNN primitive that reads it (slots
    read at several geometries left out: :func:`single`); ``post_ops``: a folded chain's
    weights packed for the primitive that adds its bias and applies its ReLU (fused.py).
    ``winograd``: the 3×3 weights :func:`winograd.eligible` takes packed for F(2×2, 3×3).
    Calling it returns ``params`` with those slots replaced by their :class:`PackedWeights`.
    """

    def __init__(self, keys: dict[Slot, bytes], post_ops: bool = False, winograd: bool = False):
        self.keys, self.post_ops, self.winograd = dict(keys), post_ops, winograd
        if self.keys and post_ops:
            fused.register()  # a loaded forward may call its fused primitives (fused.py)
        self._made: dict[Slot, tuple[Any, PackedWeights]] = {}

    def __call__(self, params: dict) -> dict:
        if not self.keys or any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(params)):
            return params  # nothing to pack, or inside a caller's trace: no host packing
        return _replace(params, {(n, j): self._packed((n, j), key, params[n][j])
                                 for (n, j), key in self.keys.items()
                                 if n in params and params[n][j] is not None})  # fmt: skip

    def _packed(self, slot: Slot, key: bytes, w: Any) -> Any:
        if isinstance(w, folding.Folded):  # the primitive with its bias and ReLU, or the plain
            k = fused.key(key, w.relu, w.bias is not None) if self.post_ops else key
            return folding.Folded(self._packed(slot, k, w.weights), w.bias, w.relu)
        if self.winograd and not fused.is_fused(key) and winograd.eligible(key):
            key = winograd.key(key)
        made = self._made.get(slot)
        if made is not None and made[0] is w and isinstance(w, jax.Array) and made[1].key == key:
            return made[1]
        if winograd.is_winograd(key):
            primitives = winograd
        else:
            primitives = fused.primitives(key) if fused.is_fused(key) else onednn.primitives(key)
        # to the device without jnp.asarray's compiled program (one per shape: ~40 ms each)
        data = jax.device_put(primitives.pack(np.asarray(w, np.float32)), may_alias=False)
        packed = PackedWeights(data, slot, tuple(w.shape), key)
        self._made[slot] = (w, packed)  # holds ``w``: its identity cannot pass to another array
        return packed


def single(found: Iterable[tuple[Slot, bytes]]) -> dict[Slot, bytes]:
    """Slot → key for the slots that appear with one key only in ``found``."""
    keys: dict[Slot, set] = {}
    for slot, key in found:
        keys.setdefault(slot, set()).add(key)
    return {slot: k.pop() for slot, k in keys.items() if len(k) == 1}


def _replace(params: dict, new: dict[Slot, Any]) -> dict:
    """``params`` with the slots in ``new`` replaced (the layers touched get new lists)."""
    out = dict(params)
    for (layer, j), value in new.items():
        out[layer] = list(out[layer])
        out[layer][j] = value
    return out
