"""A forward-only oneDNN convolution with its bias and ReLU inside the primitive (oneDNN's bias
argument and ``eltwise_relu`` post-op: ONNX Runtime's ``FusedConv``), for the chains folding.py
finds — Convolution (→ BatchNorm → Scale) → ReLU, in place — whose convolution runs on oneDNN
with packed weights (packing.py). Without it XLA adds the bias and applies the ReLU in one
elementwise pass after each oneDNN call: a read and a write of every top.

Caffe's ReLU, ``max(x, 0) + negative_slope · min(x, 0)``, is oneDNN's ``eltwise_relu`` with
``alpha = negative_slope``. The primitive is built with the weights' format ``any`` like the
plain one (onednn.py), so its weights are packed for it by its own reorder; a key names the
geometry, the slope (or none) and whether a bias is passed.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading

import jax
import jax.numpy as jnp

from caffe2jax.lowering.engines import onednn
from caffe2jax.lowering.engines.onednn import _Conv  # noqa: PLC2701 - one primitive more

# oneDNN v3 C API constants (oneapi/dnnl/dnnl_types.h)
_F32, _ANY, _A, _ABCD, _ACDB, _ABCDE = 3, 1, 2, 5, 22, 6
_FWD_INFERENCE, _CONV_DIRECT, _ELTWISE_RELU, _Q_WEIGHTS = 96, 1, 0x20, 131
_ARG_SRC, _ARG_WEIGHTS, _ARG_BIAS, _ARG_DST = 1, 33, 41, 17
_SCRATCHPAD_USER, _TARGET = 1, "caffe2jax_onednn_fused"
_Dims = ctypes.c_int64 * 12
_VOIDP = ctypes.c_void_p
_CALLBACK = ctypes.CFUNCTYPE(
    None, _VOIDP, ctypes.POINTER(_VOIDP), ctypes.c_char_p, ctypes.c_size_t, _VOIDP
)


def key(geometry: bytes, relu: float | None, bias: bool) -> bytes:
    """The fused primitive's key: the plain one's geometry, the ReLU's slope, the bias."""
    return b"%s|%s|%d" % (geometry, b"none" if relu is None else repr(float(relu)).encode(), bias)


def is_fused(k: bytes) -> bool:
    return b"|" in k


def _parse(k: bytes) -> tuple[bytes, float | None, bool]:
    geometry, relu, bias = k.split(b"|")
    return geometry, None if relu == b"none" else float(relu), bias == b"1"


class FusedConv(_Conv):
    """The forward primitive of one geometry with a bias argument and a ReLU post-op; packs
    weights (``pack``) and runs (``run_fused``) as the plain forward does."""

    def __init__(self, k: bytes):
        geometry, relu, bias = _parse(k)
        plain = onednn.primitives(geometry)  # loads oneDNN; its user-side descriptors
        g = onednn.Geometry.parse(geometry)
        lib = self.lib = plain.lib
        self.x_md, self.y_md, self.w_user_md = plain.x_md, plain.y_md, plain.w_user_md
        self.b_md = self._desc((g.w[0],), _A) if bias else None
        wdims = g.w if g.group == 1 else (g.group, g.w[0] // g.group) + g.w[1:]
        plain_attr, attr = _VOIDP(), _VOIDP()
        for a in (plain_attr, attr):
            onednn_check(lib.dnnl_primitive_attr_create(ctypes.byref(a)))
            onednn_check(lib.dnnl_primitive_attr_set_scratchpad_mode(a, _SCRATCHPAD_USER))
        if relu is not None:
            ops = _VOIDP()
            onednn_check(lib.dnnl_post_ops_create(ctypes.byref(ops)))
            alpha, beta = ctypes.c_float(relu), ctypes.c_float(0)
            onednn_check(lib.dnnl_post_ops_append_eltwise(ops, _ELTWISE_RELU, alpha, beta))
            onednn_check(lib.dnnl_primitive_attr_set_post_ops(attr, ops))
        geo = _Dims(*g.stride), _Dims(*(d - 1 for d in g.dilation)), _Dims(*g.pad), _Dims(*g.pad)
        pd = self._pd("convolution_forward", lib.engine, _FWD_INFERENCE, _CONV_DIRECT, self.x_md,
                      self._desc(wdims, _ANY), self.b_md, self.y_md, *geo, attr)  # fmt: skip
        self.prims = {"fwd": self._primitive(pd)}
        self.w_md = {"fwd": _VOIDP(lib.dnnl_primitive_desc_query_md(pd, _Q_WEIGHTS, 0))}
        self.reorders = {}
        if not lib.dnnl_memory_desc_equal(self.w_user_md, self.w_md["fwd"]):
            pd = self._pd("reorder", self.w_user_md, lib.engine, self.w_md["fwd"], lib.engine,
                          plain_attr)  # fmt: skip
            self.reorders["fwd"] = self._primitive(pd)
        self.local = threading.local()

    def _desc(self, dims, tag) -> _VOIDP:
        md = _VOIDP()
        create = self.lib.dnnl_memory_desc_create_with_tag
        onednn_check(create(ctypes.byref(md), len(dims), _Dims(*dims), _F32, tag))
        return md

    def run_fused(self, out, ins) -> None:
        """One call from XLA: ``ins`` the bottom, the packed weights and (if any) the bias."""
        descs = [(_ARG_SRC, self.x_md), (_ARG_WEIGHTS, self.w_md["fwd"])]
        descs += [(_ARG_BIAS, self.b_md)] if self.b_md is not None else []
        handles = [ins[i] for i in range(len(descs))] + [out]
        args = [(a, self._memory(md, h)) for (a, md), h in zip([*descs, (_ARG_DST, self.y_md)],
                                                               handles)]  # fmt: skip
        try:
            self._exec(self._stream(), self.prims["fwd"], args)
        finally:
            for _, mem in args:
                self.lib.dnnl_memory_destroy(mem)


def onednn_check(status: int) -> None:
    if status != 0:
        raise RuntimeError(f"oneDNN fused convolution: a call failed (dnnl_status_t {status})")


_MADE: dict[bytes, FusedConv] = {}
_LOCK = threading.Lock()


def primitives(k: bytes) -> FusedConv:
    """The fused primitive ``k`` names, built on first use (at trace time, or when packing)."""
    with _LOCK:
        if k not in _MADE:
            _MADE[k] = FusedConv(k)
        return _MADE[k]


def _run(out, ins, opaque, length, status) -> None:
    k = opaque[:length]
    try:
        primitives(k).run_fused(out, ins)
    except Exception as error:  # an exception cannot cross the C boundary back into XLA
        onednn.poison("fwd", _parse(k)[0], out)
        print(f"caffe2jax: oneDNN fused convolution failed, its result is NaN: {error!r}",
              file=sys.stderr)  # fmt: skip


@functools.cache
def register() -> _CALLBACK:
    """The custom-call target, registered once a process packs weights (packing.py) — before
    a forward the start-up cache loads (runtime/host/startup_cache.py) runs it."""
    capsule_new = ctypes.pythonapi.PyCapsule_New
    capsule_new.restype = ctypes.py_object
    capsule_new.argtypes = (_VOIDP, ctypes.c_char_p, _VOIDP)
    callback = _CALLBACK(_run)  # kept alive by the cache
    capsule = capsule_new(ctypes.cast(callback, _VOIDP), b"xla._CUSTOM_CALL_TARGET", None)
    jax.ffi.register_ffi_target(_TARGET, capsule, "cpu", api_version=0)
    return callback


def convolve(g: onednn.Geometry, x: jax.Array, w, bias, relu: float | None) -> jax.Array:
    """The convolution ``g`` of ``x`` with weights ``w`` packed for the fused primitive, plus
    ``bias`` (or None), through Caffe's ReLU of slope ``relu`` (None: no ReLU)."""
    k = key(g.key(), relu, bias is not None)
    if w.key != k:
        raise ValueError(f"weights of {w.slot} were packed for the convolution {w.key!r}, "
                         f"not {k!r}: pack them with this model's Packer")  # fmt: skip
    primitives(k)
    register()
    operands = (x, w.data) if bias is None else (x, w.data, bias)
    return jax.ffi.ffi_call(_TARGET, jax.ShapeDtypeStruct(g.shaped(g.y), jnp.float32),
                            custom_call_api_version=3, legacy_backend_config=k.decode(),
                            vmap_method="sequential")(*operands)  # fmt: skip
