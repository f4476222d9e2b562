"""Caffe's 2-D convolution through oneDNN, called from inside the jitted XLA:CPU program.

The CPU's convolution wherever libdnnl loads (when a convolution takes this path is the engine
policy's choice: ``CAFFE2JAX_CPU_CONV``, policy.py ``EnginePolicy.conv``): a 2-D ConvolutionLayer's
cross-correlation (grouped, strided, symmetric pad, dilated; bias added by XLA as before) runs
as oneDNN's ``convolution_forward`` primitive, and its gradients as oneDNN's
``convolution_backward_data`` and ``convolution_backward_weights`` (Caffe's
``ConvolutionLayer::Backward_cpu``: bottom diff and weight diff, nothing else), wired with a
``jax.custom_vjp`` only because XLA cannot differentiate a foreign call — the backward is the
true derivative. Values equal XLA's own convolution up to float32 summation order.

How it gets into the program without a compiler: oneDNN's C API (``libdnnl.so.3`` from the
``onednn-cpu-gomp`` wheel, CPU-only, GNU OpenMP) is called with :mod:`ctypes`, and the three
entry points are XLA *legacy* custom-call targets (``API_VERSION_STATUS_RETURNING_UNIFIED``:
``void f(void* out, const void** in, const char* opaque, size_t len, void* status)``) made
from :data:`ctypes.CFUNCTYPE` pointers and registered with ``jax.ffi.register_ffi_target``.
XLA hands them its own buffers (no copies); the opaque string names the geometry, whose
oneDNN primitives are built once, at trace time, and cached. Activations are channels-last
(N, H, W, C: lowering/layout.py) or Caffe's (N, C, H, W), weights Caffe's (O, C/group, kh, kw)
(``goihw`` with groups), reordered to the primitive's blocked format inside each call — except
a forward-only program's ``fwd_packed`` calls, which take weights packed once on the host
(packing.py). Each call passes through Python (the ctypes callback takes the GIL: tens of µs,
against milliseconds of convolution); measured in benchmarks/onednn_conv.py.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
import threading
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend import environment

LIB_ENV = "CAFFE2JAX_ONEDNN_LIB"

# oneDNN v3 C API constants (oneapi/dnnl/dnnl_types.h, dnnl_common_types.h)
_F32, _ANY, _ABCD, _ACDB, _ABCDE = 3, 1, 5, 22, 6
_CPU, _STREAM_IN_ORDER = 1, 1
_FWD_TRAINING, _BWD_DATA, _BWD_WEIGHTS, _CONV_DIRECT = 64, 160, 192, 1
_Q_SRC, _Q_DIFF_SRC, _Q_WEIGHTS, _Q_DIFF_WEIGHTS, _Q_DST, _Q_DIFF_DST = range(129, 135)
_ARG_SRC, _ARG_DST, _ARG_WEIGHTS = 1, 17, 33
_ARG_DIFF_SRC, _ARG_DIFF_DST, _ARG_DIFF_WEIGHTS = 129, 145, 161
_ARG_FROM, _ARG_TO, _ARG_SCRATCHPAD = 1, 17, 80
_Q_SCRATCHPAD, _SCRATCHPAD_USER = 136, 1
_ALLOCATE = ctypes.c_void_p(-1 & (2**64 - 1))  # DNNL_MEMORY_ALLOCATE

_Dims = ctypes.c_int64 * 12  # dnnl_dims_t


class _ExecArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", ctypes.c_void_p)]


_VOIDP = ctypes.c_void_p
_CALLBACK = ctypes.CFUNCTYPE(
    None, _VOIDP, ctypes.POINTER(_VOIDP), ctypes.c_char_p, ctypes.c_size_t, _VOIDP
)


def _find_library() -> str:
    if environment.value(LIB_ENV):
        return environment.value(LIB_ENV)
    for prefix in (sys.prefix, sys.base_prefix):
        path = os.path.join(prefix, "lib", "libdnnl.so.3")
        if os.path.exists(path):
            return path
    found = ctypes.util.find_library("dnnl")
    if found is None:
        raise OSError(
            "CAFFE2JAX_CPU_CONV=onednn needs oneDNN's libdnnl.so.3: pip install "
            "'caffe2jax[onednn]' (the onednn-cpu-gomp wheel), or point "
            f"${LIB_ENV} at the library"
        )
    return found


def _load(path: str) -> ctypes.CDLL:
    """libdnnl with its GNU OpenMP threads sleeping, not spinning, between calls (unless
    ``$OMP_WAIT_POLICY`` says otherwise): XLA's own threads and any other OpenMP runtime in
    the process need the cores between two convolutions. libgomp reads the variable when it
    is loaded, so it is set only around the load."""
    old = os.environ.get("OMP_WAIT_POLICY")
    os.environ["OMP_WAIT_POLICY"] = old or "PASSIVE"
    try:
        return ctypes.CDLL(path)
    finally:
        if old is None:
            del os.environ["OMP_WAIT_POLICY"]


@functools.cache
def _dnnl() -> ctypes.CDLL:
    """libdnnl (loaded once), its CPU engine, and the custom-call targets registered."""
    lib = _load(_find_library())
    lib.dnnl_primitive_desc_query_md.restype = _VOIDP
    lib.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
    engine = _VOIDP()
    _check(lib.dnnl_engine_create(ctypes.byref(engine), _CPU, 0), "engine_create")
    lib.engine = engine
    capsule_new = ctypes.pythonapi.PyCapsule_New
    capsule_new.restype = ctypes.py_object
    capsule_new.argtypes = (_VOIDP, ctypes.c_char_p, _VOIDP)
    lib.callbacks = {}
    for kind in ("fwd", "fwd_packed", "bwd_data", "bwd_weights"):
        callback = _CALLBACK(functools.partial(_run, kind))
        lib.callbacks[kind] = callback  # keep the function pointer alive
        capsule = capsule_new(ctypes.cast(callback, _VOIDP), b"xla._CUSTOM_CALL_TARGET", None)
        jax.ffi.register_ffi_target(f"caffe2jax_onednn_{kind}", capsule, "cpu", api_version=0)
    return lib


def available() -> str | None:
    """None if oneDNN loads, else why not."""
    try:
        _dnnl()
    except OSError as error:
        return str(error)
    return None


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"oneDNN {what} failed (dnnl_status_t {status})")


@dataclass(frozen=True)
class Geometry:
    """One 2-D convolution: x (N, C, H, W) ⊛ w (O, C/group, kh, kw) → (N, O, OH, OW)."""

    x: tuple[int, int, int, int]  # Caffe order (N, C, H, W), whatever the layout
    w: tuple[int, int, int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]
    dilation: tuple[int, int]
    group: int
    channels_last: bool

    @property
    def y(self) -> tuple[int, int, int, int]:
        n, _, h, w = self.x
        ext = [(k - 1) * d + 1 for k, d in zip(self.w[2:], self.dilation)]
        oh, ow = (
            (s + 2 * p - e) // st + 1 for s, p, e, st in zip((h, w), self.pad, ext, self.stride)
        )
        return (n, self.w[0], oh, ow)

    def shaped(self, dims):
        """An array's shape in this geometry's activation layout."""
        n, c, h, w = dims
        return (n, h, w, c) if self.channels_last else tuple(dims)

    def key(self) -> bytes:
        """The custom call's opaque bytes: every field, as integers."""
        fields = (*self.x, *self.w, *self.stride, *self.pad, *self.dilation, self.group)
        return ",".join(map(str, (*fields, int(self.channels_last)))).encode()

    @classmethod
    def parse(cls, key: bytes) -> Geometry:
        v = tuple(map(int, key.decode().split(",")))
        return cls(v[0:4], v[4:8], v[8:10], v[10:12], v[12:14], v[14], bool(v[15]))


def _md(lib, dims, tag) -> _VOIDP:
    md = _VOIDP()
    arr = _Dims(*dims)
    _check(lib.dnnl_memory_desc_create_with_tag(ctypes.byref(md), len(dims), arr, _F32, tag), "md")
    return md


class _Conv:
    """The forward, backward-data and backward-weights primitives of one :class:`Geometry`.

    Each primitive uses a scratchpad the caller provides (``scratchpad_mode_user``), allocated
    per call: oneDNN's own is shared by the primitives a thread created, and XLA runs them on
    other threads, possibly at once.
    """

    def __init__(self, g: Geometry):
        lib = self.lib = _dnnl()
        act = _ACDB if g.channels_last else _ABCD
        if g.group == 1:
            wdims, wtag = g.w, _ABCD
        else:
            wdims, wtag = (g.group, g.w[0] // g.group) + g.w[1:], _ABCDE
        self.x_md, self.y_md = _md(lib, g.x, act), _md(lib, g.y, act)
        self.w_user_md = _md(lib, wdims, wtag)
        attr = self.attr = _VOIDP()
        _check(lib.dnnl_primitive_attr_create(ctypes.byref(attr)), "attr")
        _check(lib.dnnl_primitive_attr_set_scratchpad_mode(attr, _SCRATCHPAD_USER), "attr")
        self.prims, self.w_md, self.reorders = {}, {}, {}
        for kind, (pd, query) in self._descriptors(g, _md(lib, wdims, _ANY)).items():
            self.prims[kind] = self._primitive(pd)
            self.w_md[kind] = _VOIDP(lib.dnnl_primitive_desc_query_md(pd, query, 0))
            src, dst = self.w_user_md, self.w_md[kind]
            if kind == "bwd_weights":
                src, dst = dst, src
            if not lib.dnnl_memory_desc_equal(src, dst):
                pd = self._pd("reorder", src, lib.engine, dst, lib.engine, attr)
                self.reorders[kind] = self._primitive(pd)
        self.local = threading.local()

    def _descriptors(self, g: Geometry, w_any) -> dict[str, tuple[_VOIDP, int]]:
        """The three primitive descriptors (weights in the format oneDNN prefers, ``any``),
        each with the query naming its weights' memory descriptor."""
        geo = _Dims(*g.stride), _Dims(*(d - 1 for d in g.dilation)), _Dims(*g.pad), _Dims(*g.pad)
        x, y, eng, attr = self.x_md, self.y_md, self.lib.engine, self.attr
        fwd = self._pd("convolution_forward", eng, _FWD_TRAINING, _CONV_DIRECT, x, w_any, None, y,
                       *geo, attr)  # fmt: skip
        data = self._pd("convolution_backward_data", eng, _CONV_DIRECT, x, w_any, y, *geo, fwd,
                        attr)  # fmt: skip
        weights = self._pd("convolution_backward_weights", eng, _CONV_DIRECT, x, w_any, None, y,
                           *geo, fwd, attr)  # fmt: skip
        return {
            "fwd": (fwd, _Q_WEIGHTS),
            "bwd_data": (data, _Q_WEIGHTS),
            "bwd_weights": (weights, _Q_DIFF_WEIGHTS),
        }

    def _pd(self, what: str, *args) -> _VOIDP:
        pd = _VOIDP()
        create = getattr(self.lib, f"dnnl_{what}_primitive_desc_create")
        _check(create(ctypes.byref(pd), *args), f"{what} primitive descriptor")
        return pd

    def _primitive(self, pd):
        """(primitive, its scratchpad's memory descriptor)."""
        prim = _VOIDP()
        _check(self.lib.dnnl_primitive_create(ctypes.byref(prim), pd), "primitive")
        return prim, _VOIDP(self.lib.dnnl_primitive_desc_query_md(pd, _Q_SCRATCHPAD, 0))

    def _stream(self):
        stream = getattr(self.local, "stream", None)
        if stream is None:
            stream = self.local.stream = _VOIDP()
            create = self.lib.dnnl_stream_create
            _check(create(ctypes.byref(stream), self.lib.engine, _STREAM_IN_ORDER), "stream")
        return stream

    def _memory(self, md, handle):
        handle, mem = handle if isinstance(handle, _VOIDP) else _VOIDP(handle), _VOIDP()
        _check(self.lib.dnnl_memory_create(ctypes.byref(mem), md, self.lib.engine, handle),
               "memory")  # fmt: skip
        return mem

    def _exec(self, stream, primitive, args):
        prim, scratch_md = primitive
        scratch = self._memory(scratch_md, _ALLOCATE)  # zero-sized where none is needed
        try:
            args = [*args, (_ARG_SCRATCHPAD, scratch)]
            arr = (_ExecArg * len(args))(*args)
            _check(self.lib.dnnl_primitive_execute(prim, stream, len(args), arr), "execute")
            _check(self.lib.dnnl_stream_wait(stream), "stream_wait")
        finally:
            self.lib.dnnl_memory_destroy(scratch)

    def pack(self, w: np.ndarray) -> np.ndarray:
        """Caffe-layout weights ``w`` reordered on the host into the forward primitive's own
        format (what a ``fwd_packed`` call takes; flat, padding zero-filled by the reorder)."""
        w = np.ascontiguousarray(w, np.float32)
        out = np.empty(self.lib.dnnl_memory_desc_get_size(self.w_md["fwd"]) // 4, np.float32)
        if "fwd" not in self.reorders:
            out[:] = w.ravel()
            return out
        pairs = ((self.w_user_md, w), (self.w_md["fwd"], out))
        mems = [self._memory(md, array.ctypes.data) for md, array in pairs]
        try:
            self._exec(self._stream(), self.reorders["fwd"], list(zip((_ARG_FROM, _ARG_TO), mems)))
        finally:
            for mem in mems:
                self.lib.dnnl_memory_destroy(mem)
        return out

    def run(self, kind: str, out, ins) -> None:
        """One call from XLA: ``out`` the result buffer, ``ins`` the operand buffers
        (``fwd_packed``: the forward with weights :meth:`pack` made)."""
        lib, stream = self.lib, self._stream()
        mems, packed = [], kind == "fwd_packed"
        kind = "fwd" if packed else kind
        try:
            w_md = self.w_md["fwd"] if packed else self.w_user_md
            user_w = self._memory(w_md, out if kind == "bwd_weights" else ins[1])
            mems.append(user_w)
            w = user_w
            if kind in self.reorders and not packed:
                w = self._memory(self.w_md[kind], _ALLOCATE)
                mems.append(w)
                if kind != "bwd_weights":
                    self._exec(stream, self.reorders[kind], [(_ARG_FROM, user_w), (_ARG_TO, w)])
            if kind == "fwd":
                x, y = self._memory(self.x_md, ins[0]), self._memory(self.y_md, out)
                args = [(_ARG_SRC, x), (_ARG_WEIGHTS, w), (_ARG_DST, y)]
            elif kind == "bwd_data":
                dy, dx = self._memory(self.y_md, ins[0]), self._memory(self.x_md, out)
                args = [(_ARG_DIFF_DST, dy), (_ARG_WEIGHTS, w), (_ARG_DIFF_SRC, dx)]
            else:
                x, dy = self._memory(self.x_md, ins[0]), self._memory(self.y_md, ins[1])
                args = [(_ARG_SRC, x), (_ARG_DIFF_DST, dy), (_ARG_DIFF_WEIGHTS, w)]
            mems += [m for _, m in args if m not in (w, user_w)]
            self._exec(stream, self.prims[kind], args)
            if kind == "bwd_weights" and kind in self.reorders:
                self._exec(stream, self.reorders[kind], [(_ARG_FROM, w), (_ARG_TO, user_w)])
        finally:
            for mem in mems:
                lib.dnnl_memory_destroy(mem)


_CONVS: dict[bytes, _Conv] = {}
_LOCK = threading.Lock()


def primitives(key: bytes) -> _Conv:
    """The primitives of the geometry ``key`` names, built on first use (normally at trace
    time; in the callback only for a program compiled by an earlier process); lowering/engines/
    packing.py packs weights for their forward."""
    conv = _CONVS.get(key)
    if conv is None:
        with _LOCK:
            conv = _CONVS.get(key)
            if conv is None:
                conv = _CONVS[key] = _Conv(Geometry.parse(key))
    return conv


def _run(kind, out, ins, opaque, length, status) -> None:
    key = opaque[:length]
    try:
        primitives(key).run(kind, out, ins)
    except Exception as error:  # an exception cannot cross the C boundary back into XLA
        poison(kind, key, out)
        print(f"caffe2jax: oneDNN {kind} convolution failed, its result is NaN: {error!r}",
              file=sys.stderr)  # fmt: skip


def poison(kind: str, key: bytes, out: int) -> None:
    """Fill a failed call's result with NaN: jaxlib exports no way to fail the XLA call, and
    a step must not go on with a silently wrong number (the loss turns NaN instead)."""
    g = Geometry.parse(key)
    dims = {"fwd": g.y, "fwd_packed": g.y, "bwd_data": g.x, "bwd_weights": g.w}[kind]
    count = int(np.prod(dims))
    buffer = (ctypes.c_float * count).from_address(out)
    np.frombuffer(buffer, np.float32)[:] = np.nan


def call(kind: str, g: Geometry, shape, *operands):
    key = g.key()
    primitives(key)  # build (and check) the primitives now, at trace time
    return jax.ffi.ffi_call(
        f"caffe2jax_onednn_{kind}",
        jax.ShapeDtypeStruct(shape, jnp.float32),
        custom_call_api_version=3,
        legacy_backend_config=key.decode(),
        vmap_method="sequential",
    )(*operands)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def conv2d(g: Geometry, x: jax.Array, w: jax.Array) -> jax.Array:
    """Caffe's 2-D convolution (no bias) of ``x`` with Caffe-layout weights ``w`` by oneDNN."""
    return call("fwd", g, g.shaped(g.y), x, w)


def _fwd(g, x, w):
    return conv2d(g, x, w), (x, w)


def _bwd(g, res, dy):
    return backward(g, *res, dy)


def backward(g: Geometry, x: jax.Array, w: jax.Array, dy: jax.Array) -> tuple:
    """The bottom and weight diffs of the convolution ``g`` (Caffe's Backward_cpu) by oneDNN's
    backward-data and backward-weights primitives, whatever computed the forward."""
    dx = call("bwd_data", g, g.shaped(g.x), dy, w)
    dw = call("bwd_weights", g, g.w, x, dy)
    return dx, dw


conv2d.defvjp(_fwd, _bwd)


def geometry(x, w, stride, pad, dilation, group, channels_last: bool) -> Geometry:
    """The :class:`Geometry` of ``x`` (N, H, W, C) if ``channels_last`` else (N, C, H, W)
    convolved with ``w`` (O, C/group, kh, kw)."""
    n, c, h, wd = (x.shape[0], x.shape[3], x.shape[1], x.shape[2]) if channels_last else x.shape
    return Geometry((n, c, h, wd), tuple(w.shape), tuple(stride), tuple(pad), tuple(dilation),
                    group, channels_last)  # fmt: skip


def convolution(x, w, stride, pad, dilation, group, channels_last: bool) -> jax.Array:
    """``lax.conv_general_dilated``'s result for a float32 2-D Caffe convolution, by oneDNN:
    ``x`` (N, H, W, C) if ``channels_last`` else (N, C, H, W), ``w`` (O, C/group, kh, kw)."""
    return conv2d(geometry(x, w, stride, pad, dilation, group, channels_last), x, w)
