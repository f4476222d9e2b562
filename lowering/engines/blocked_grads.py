"""A oneDNN convolution whose weight diff is computed on oneDNN's own blocked activations.

The ``onednn-blocked`` form (policy.py ``EnginePolicy.onednn_blocked_weight_grads``): forward
and bottom diff exactly as the ``onednn`` form (onednn.py), and the weight diff — Caffe's
``ConvolutionLayer::Backward_cpu`` ``weight_diff += top_diff ⊛ bottom`` — by oneDNN's
backward-weights primitive built with the activations' format ``any``: the bottom and the top
diff are reordered from the program's channels-last (N, H, W, C) buffers into the blocked
format oneDNN picks (``aBcd8b`` on AVX2), and the diff weights back into Caffe's (O, C, kh, kw).
Same primitive family (``jit:avx2``), same sums: the weight diff came out bit-identical to the
plain call's in every case measured. Why: with channels-last activations oneDNN 3.2's
backward-weights kernel for large kernels runs at about half the speed (SegNet-basic's 7×7
64→64 at 4×72×96: 1,217–1,552 ms vs 584–722 ms blocked, reorders included, load 10–11;
benchmarks/segnet_train.py; docs/performance.md "SegNet-basic (round 6)"), which is why
PyTorch, whose NCHW tensors oneDNN reorders into ``aBcd8b``, ran this step faster.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading

import jax
import jax.numpy as jnp

from caffe2jax.lowering.engines import onednn

# oneDNN v3 C API constants (oneapi/dnnl/dnnl_types.h, dnnl_common_types.h)
_F32, _ANY, _ABCDE, _FWD_TRAINING, _CONV_DIRECT = 3, 1, 6, 64, 1
_Q_SRC, _Q_DIFF_WEIGHTS, _Q_DIFF_DST, _Q_SCRATCHPAD = 129, 132, 134, 136
_ARG_SRC, _ARG_DIFF_DST, _ARG_DIFF_WEIGHTS, _ARG_FROM, _ARG_TO, _ARG_SCRATCHPAD = (
    1, 145, 161, 1, 17, 80)  # fmt: skip
_ALLOCATE = ctypes.c_void_p(-1 & (2**64 - 1))  # DNNL_MEMORY_ALLOCATE
_TARGET = "caffe2jax_onednn_bwd_weights_blocked"
_Dims = ctypes.c_int64 * 12
_VOIDP = ctypes.c_void_p
_CALLBACK = ctypes.CFUNCTYPE(
    None, _VOIDP, ctypes.POINTER(_VOIDP), ctypes.c_char_p, ctypes.c_size_t, _VOIDP
)


class _ExecArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", ctypes.c_void_p)]


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"oneDNN blocked weight diff: {what} failed (dnnl_status_t {status})")


class BlockedWeightGrads:
    """One geometry's backward-weights primitive on blocked activations, and the three
    reorders around it (bottom and top diff in, diff weights out)."""

    def __init__(self, key: bytes):
        plain = onednn.primitives(key)  # loads oneDNN; the program's own descriptors
        g = onednn.Geometry.parse(key)
        lib, self.lib, self.attr = plain.lib, plain.lib, plain.attr
        wdims = g.w if g.group == 1 else (g.group, g.w[0] // g.group) + g.w[1:]
        x, w, y = (self._any(d) for d in (g.x, wdims, g.y))
        geo = _Dims(*g.stride), _Dims(*(d - 1 for d in g.dilation)), _Dims(*g.pad), _Dims(*g.pad)
        hint = self._pd("convolution_forward", lib.engine, _FWD_TRAINING, _CONV_DIRECT, x, w,
                        None, y, *geo, self.attr)  # fmt: skip
        pd = self._pd("convolution_backward_weights", lib.engine, _CONV_DIRECT, x, w, None, y,
                      *geo, hint, self.attr)  # fmt: skip
        self.weights = self._primitive(pd)
        self.x_md, self.dy_md, self.dw_md = (
            _VOIDP(lib.dnnl_primitive_desc_query_md(pd, q, 0))
            for q in (_Q_SRC, _Q_DIFF_DST, _Q_DIFF_WEIGHTS))  # fmt: skip
        self.user = plain.x_md, plain.y_md, plain.w_user_md
        pairs = zip(self.user, (self.x_md, self.dy_md, self.dw_md))
        self.reorders = [self._reorder(a, b) if i < 2 else self._reorder(b, a)
                         for i, (a, b) in enumerate(pairs)]  # fmt: skip
        self.local = threading.local()

    def _any(self, dims) -> _VOIDP:
        md = _VOIDP()
        create = self.lib.dnnl_memory_desc_create_with_tag
        _check(create(ctypes.byref(md), len(dims), _Dims(*dims), _F32, _ANY), "memory desc")
        return md

    def _pd(self, what: str, *args) -> _VOIDP:
        pd = _VOIDP()
        create = getattr(self.lib, f"dnnl_{what}_primitive_desc_create")
        _check(create(ctypes.byref(pd), *args), f"{what} primitive descriptor")
        return pd

    def _primitive(self, pd) -> tuple[_VOIDP, _VOIDP]:
        prim = _VOIDP()
        _check(self.lib.dnnl_primitive_create(ctypes.byref(prim), pd), "primitive")
        return prim, _VOIDP(self.lib.dnnl_primitive_desc_query_md(pd, _Q_SCRATCHPAD, 0))

    def _reorder(self, src, dst):
        """A reorder primitive, or None where the formats already agree."""
        if self.lib.dnnl_memory_desc_equal(src, dst):
            return None
        return self._primitive(self._pd("reorder", src, self.lib.engine, dst, self.lib.engine,
                                        self.attr))  # fmt: skip

    def _memory(self, md, handle, made: list) -> _VOIDP:
        mem = _VOIDP()
        handle = handle if isinstance(handle, _VOIDP) else _VOIDP(handle)
        _check(self.lib.dnnl_memory_create(ctypes.byref(mem), md, self.lib.engine, handle),
               "memory")  # fmt: skip
        made.append(mem)
        return mem

    def _exec(self, primitive, args, made: list) -> None:
        prim, scratch_md = primitive
        args = [*args, (_ARG_SCRATCHPAD, self._memory(scratch_md, _ALLOCATE, made))]
        stream = getattr(self.local, "stream", None)
        if stream is None:
            stream = self.local.stream = _VOIDP()
            _check(self.lib.dnnl_stream_create(ctypes.byref(stream), self.lib.engine, 1),
                   "stream")  # fmt: skip
        arr = (_ExecArg * len(args))(*args)
        _check(self.lib.dnnl_primitive_execute(prim, stream, len(args), arr), "execute")
        _check(self.lib.dnnl_stream_wait(stream), "stream wait")

    def run(self, out, ins) -> None:
        """One call from XLA: ``ins`` the bottom and the top diff, ``out`` the weight diff
        (Caffe's layout); the blocked copies are allocated per call, like the scratchpads."""
        made: list = []
        try:
            user = [self._memory(md, h, made) for md, h in zip(self.user, (ins[0], ins[1], out))]
            mine = [self._memory(md, _ALLOCATE, made) if r is not None else u
                    for md, r, u in zip((self.x_md, self.dy_md, self.dw_md), self.reorders,
                                        user)]  # fmt: skip
            for i in (0, 1):
                if self.reorders[i] is not None:
                    self._exec(self.reorders[i], [(_ARG_FROM, user[i]), (_ARG_TO, mine[i])], made)
            args = [(_ARG_SRC, mine[0]), (_ARG_DIFF_DST, mine[1]), (_ARG_DIFF_WEIGHTS, mine[2])]
            self._exec(self.weights, args, made)
            if self.reorders[2] is not None:
                self._exec(self.reorders[2], [(_ARG_FROM, mine[2]), (_ARG_TO, user[2])], made)
        finally:
            for mem in made:
                self.lib.dnnl_memory_destroy(mem)


_MADE: dict[bytes, BlockedWeightGrads] = {}
_LOCK = threading.Lock()


def primitives(key: bytes) -> BlockedWeightGrads:
    """The blocked backward-weights primitives of the geometry ``key``, built on first use."""
    with _LOCK:
        if key not in _MADE:
            _MADE[key] = BlockedWeightGrads(key)
        return _MADE[key]


def _run(out, ins, opaque, length, status) -> None:
    key = opaque[:length]
    try:
        primitives(key).run(out, ins)
    except Exception as error:  # an exception cannot cross the C boundary back into XLA
        onednn.poison("bwd_weights", key, out)
        print(f"caffe2jax: oneDNN blocked weight diff failed, its result is NaN: {error!r}",
              file=sys.stderr)  # fmt: skip


@functools.cache
def register() -> _CALLBACK:
    """The custom-call target, registered once per process (before any program calls it)."""
    capsule_new = ctypes.pythonapi.PyCapsule_New
    capsule_new.restype = ctypes.py_object
    capsule_new.argtypes = (_VOIDP, ctypes.c_char_p, _VOIDP)
    callback = _CALLBACK(_run)  # kept alive by the cache
    capsule = capsule_new(ctypes.cast(callback, _VOIDP), b"xla._CUSTOM_CALL_TARGET", None)
    jax.ffi.register_ffi_target(_TARGET, capsule, "cpu", api_version=0)
    return callback


def weight_diff(g: onednn.Geometry, x: jax.Array, dy: jax.Array) -> jax.Array:
    """The weight diff (O, C/group, kh, kw) of the convolution ``g`` at bottom ``x`` and top
    diff ``dy`` (the program's layout), by the blocked primitive."""
    key = g.key()
    primitives(key)  # build (and check) the primitives now, at trace time
    register()
    return jax.ffi.ffi_call(_TARGET, jax.ShapeDtypeStruct(g.w, jnp.float32),
                            custom_call_api_version=3, legacy_backend_config=key.decode(),
                            vmap_method="sequential")(x, dy)  # fmt: skip


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def conv2d(g: onednn.Geometry, x: jax.Array, w: jax.Array) -> jax.Array:
    """onednn.conv2d's forward; the bottom diff oneDNN's as there, the weight diff
    :func:`weight_diff` (custom_vjp only because XLA cannot differentiate a foreign call: the
    backward is the true derivative)."""
    return onednn.call("fwd", g, g.shaped(g.y), x, w)


def _fwd(g, x, w):
    return conv2d(g, x, w), (x, w)


def _bwd(g, res, dy):
    x, w = res
    return onednn.call("bwd_data", g, g.shaped(g.x), dy, w), weight_diff(g, x, dy)


conv2d.defvjp(_fwd, _bwd)


def convolution(x, w, stride, pad, dilation, group, channels_last: bool) -> jax.Array:
    """onednn.convolution's result, its weight diff on blocked activations."""
    return conv2d(onednn.geometry(x, w, stride, pad, dilation, group, channels_last), x, w)
