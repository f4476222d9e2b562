"""Caffe's weight fillers (filler.hpp), drawn from a JAX key.

Caffe's RNG cannot be reproduced bit for bit, so random fillers match Caffe's distributions
(bounds, mean, std, fan rules, sparsity); ``constant`` and ``bilinear`` are exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.registry import NetState

if TYPE_CHECKING:
    from caffe2jax.lowering.graph import Graph, Params

Shape = tuple[int, ...]


def _fans(shape: Shape) -> tuple[float, float]:
    """Caffe's fan_in = count / shape[0] and fan_out = count / shape[1] (count when 1-D)."""
    count = math.prod(shape)
    fan_in = count / shape[0] if shape and shape[0] else count
    fan_out = count / shape[1] if len(shape) > 1 and shape[1] else count
    return fan_in, fan_out


def _variance_n(filler: caffe_pb2.FillerParameter, shape: Shape) -> float:
    fan_in, fan_out = _fans(shape)
    norm = filler.variance_norm
    if norm == caffe_pb2.FillerParameter.FAN_OUT:
        return fan_out
    if norm == caffe_pb2.FillerParameter.AVERAGE:
        return (fan_in + fan_out) / 2.0
    return fan_in


class Draws:
    """Standard normal and U(0, 1) samples, handed out in order from two pools.

    A whole net's random fillers share one normal and one uniform draw (two random ops in the
    init program, whatever the number of blobs): drawing per blob costs one compilation per
    distinct blob size, which makes initialising GoogLeNet take seconds.
    """

    def __init__(self, key: jax.Array, normals: int, uniforms: int, dtype=jnp.float32):
        k_normal, k_uniform = jax.random.split(key)
        self._pools = {
            "normal": jax.random.normal(k_normal, (normals,), dtype) if normals else None,
            "uniform": jax.random.uniform(k_uniform, (uniforms,), dtype) if uniforms else None,
        }
        self._used = {"normal": 0, "uniform": 0}

    def _take(self, kind: str, shape: Shape) -> jax.Array:
        n = math.prod(shape)
        start = self._used[kind]
        self._used[kind] = start + n
        return self._pools[kind][start : start + n].reshape(shape)

    def normal(self, shape: Shape) -> jax.Array:
        return self._take("normal", shape)

    def uniform(self, shape: Shape) -> jax.Array:
        return self._take("uniform", shape)


def draws_needed(filler: caffe_pb2.FillerParameter | None, shape: Shape) -> tuple[int, int]:
    """(standard normals, uniforms) the filler takes from :class:`Draws` for ``shape``."""
    n = math.prod(shape)
    kind = filler.type if filler is not None else "constant"
    if kind in ("gaussian", "msra"):
        sparse = kind == "gaussian" and filler.sparse >= 0
        return n, n if sparse else 0
    if kind in ("uniform", "xavier", "positive_unitball"):
        return 0, n
    return 0, 0


def _constant(filler, shape, draws, dtype):
    return jnp.full(shape, filler.value, dtype)


def _uniform(filler, shape, draws, dtype):
    if filler.min > filler.max:
        raise NetError(f"uniform filler needs min <= max, got min {filler.min} > max {filler.max}")
    return filler.min + (filler.max - filler.min) * draws.uniform(shape)


def _gaussian(filler, shape, draws, dtype):
    """N(mean, std); with ``sparse`` ≥ 0 each weight survives with p = sparse / shape[0]."""
    if filler.std <= 0:
        raise NetError(f"gaussian filler needs std > 0, got {filler.std}")
    if filler.sparse < -1:
        raise NetError(f"gaussian filler 'sparse' must be -1 (off) or >= 0, got {filler.sparse}")
    values = filler.mean + filler.std * draws.normal(shape)
    if filler.sparse >= 0:
        if len(shape) < 1:
            raise NetError("gaussian filler with 'sparse' needs a blob of at least 1 axis")
        keep = filler.sparse / shape[0]
        if keep > 1:
            raise NetError(
                f"gaussian filler 'sparse' ({filler.sparse}) exceeds the blob's first axis "
                f"({shape[0]}): the keep probability sparse/{shape[0]} must be <= 1"
            )
        values = values * (draws.uniform(shape) < keep).astype(dtype)
    return values


def _positive_unitball(filler, shape, draws, dtype):
    """U(0, 1), then every item (index of axis 0) is scaled to sum to 1."""
    flat = draws.uniform(shape).reshape(shape[0], -1)
    return (flat / flat.sum(axis=1, keepdims=True)).reshape(shape)


def _xavier(filler, shape, draws, dtype):
    """U(-a, a) with a = sqrt(3 / n), n chosen by variance_norm."""
    scale = math.sqrt(3.0 / _variance_n(filler, shape))
    return -scale + 2 * scale * draws.uniform(shape)


def _msra(filler, shape, draws, dtype):
    """N(0, 2 / n), n chosen by variance_norm."""
    std = math.sqrt(2.0 / _variance_n(filler, shape))
    return std * draws.normal(shape)


def _bilinear(filler, shape, draws, dtype):
    """Caffe's BilinearFiller: every (kh, kw) slice holds the same bilinear upsampling kernel.

    Upstream's formula, ``c = (k − 1) / (2f)`` with ``f = ceil(k / 2)``, evaluated operation by
    operation in the blob's precision as Caffe's loop does, so float32 values are bit-exact.
    """
    if len(shape) != 4 or shape[2] != shape[3]:
        raise NetError(f"bilinear filler needs a 4-D blob with square kernels, got {list(shape)}")
    k = shape[3]
    f = math.ceil(k / 2.0)
    dt = np.dtype(dtype) if np.dtype(dtype) in (np.float32, np.float64) else np.dtype(np.float32)
    c = dt.type((k - 1) / (2.0 * f))
    i = np.arange(math.prod(shape))
    x, y = (i % k).astype(dt), ((i // k) % k).astype(dt)
    one, fd = dt.type(1), dt.type(f)
    values = (one - np.abs(x / fd - c)) * (one - np.abs(y / fd - c))
    return jnp.asarray(values.reshape(shape), dtype)


FILLERS: dict[str, Callable] = {
    "constant": _constant,
    "uniform": _uniform,
    "gaussian": _gaussian,
    "positive_unitball": _positive_unitball,
    "xavier": _xavier,
    "msra": _msra,
    "bilinear": _bilinear,
}


def fill(
    filler: caffe_pb2.FillerParameter | None,
    shape: Shape,
    key: jax.Array | Draws,
    dtype=jnp.float32,
) -> jax.Array:
    """A blob of ``shape`` filled as Caffe's filler ``filler`` would (None: zeros), from a key
    or from a net's shared :class:`Draws`."""
    if filler is None:
        return jnp.zeros(shape, dtype)
    try:
        make = FILLERS[filler.type]
    except KeyError:
        raise NetError(
            f"unknown filler type '{filler.type}'; supported: {', '.join(sorted(FILLERS))}"
        ) from None
    if filler.type != "gaussian" and filler.sparse != -1:
        raise NetError(f"filler '{filler.type}' does not support 'sparse' (only gaussian does)")
    shape = tuple(shape)
    if not math.prod(shape):  # Caffe fills nothing (xavier/msra's fan would divide by 0)
        return jnp.zeros(shape, dtype)
    draws = key if isinstance(key, Draws) else Draws(key, *draws_needed(filler, shape), dtype)
    return make(filler, shape, draws, dtype).astype(dtype)


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
