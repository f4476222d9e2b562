"""What a second run of a net skips: its shape inference, and the trace, lowering and compile
of its programs (JAX's persistent cache, :mod:`.compile_cache`, starts after the lowering).

Two kinds of entries, in ``startup/`` beside the compilation cache (the same switch turns
both off: ``CAFFE2JAX_NO_COMPILE_CACHE=1``, the CLI's ``--no-compile-cache``):

* ``shapes``: every layer's top shapes (JSON), read back into
  :class:`~caffe2jax.lowering.graph.Graph` instead of one ``jax.eval_shape`` per layer;
* ``programs``: each forward program traced and lowered once (``jax.export``, StableHLO),
  loaded instead of tracing the net again; its compile is then a hit in JAX's persistent
  cache. (Serialized executables were tried: XLA:CPU cannot serialize again an executable it
  loaded from JAX's cache — the copy misses functions at run time — so the cache keeps the
  lowered program and leaves executables to JAX.)

Each entry is keyed by a SHA-256 of everything its value depends on: the net as built (each
layer's name, type, form, blobs and LayerParameter bytes, the net's phase and dialect), the
input shapes, dtype, precision and engine policy, the size and mtime of every file a layer
names (a DetectionEvaluate's name_size_file is read into the program), caffe2jax's version
and the size and mtime of each of its source files, JAX's and jaxlib's versions, the JAX
settings that change a program, ``XLA_FLAGS``, the devices and the CPU. A net with a Python
layer, or a layer lowered by code outside caffe2jax, is never cached (its behaviour is code
the key cannot see). A cache entry that does not load (another JAX, a damaged file) is
logged (logger ``caffe2jax.startup``) and the net is compiled as without the cache.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

from caffe2jax.lowering.registry import NetState
from caffe2jax.runtime.formats.atomic import atomic_write
from caffe2jax.runtime.host import compile_cache, first_run

log = logging.getLogger("caffe2jax.startup")

# the oneDNN convolutions' custom calls (lowering/engines/onednn.py, fused.py), registered by
# the engine policy when a net is planned, in the process that loads the program too
_FOREIGN_CALLS = [jax.export.DisabledSafetyCheck.custom_call(f"caffe2jax_onednn_{kind}")
                  for kind in ("fwd", "fwd_packed", "fused", "bwd_data",
                               "bwd_weights")]  # fmt: skip
with contextlib.suppress(ValueError):  # a state's tree, in a serialized program's signature
    jax.export.register_pytree_node_serialization(
        NetState, serialized_name="caffe2jax.NetState",
        serialize_auxdata=lambda _: b"", deserialize_auxdata=lambda _: None)  # fmt: skip

_PACKAGES = ("caffe2jax", "caffe2jax.frontend", "caffe2jax.lowering", "caffe2jax.runtime")
# JAX settings a program's lowering reads
_JAX_SETTINGS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_default_prng_impl",
                 "jax_threefry_partitionable", "jax_numpy_rank_promotion")  # fmt: skip


def folder() -> Path | None:
    """``<compile cache>/startup``, or None while the compilation cache is switched off."""
    if compile_cache.switched_off() or compile_cache.turned_off():
        return None
    return compile_cache.cache_dir() / "startup"


def version() -> str:
    """caffe2jax's installed version ("" when it is not installed, run from a checkout)."""
    try:
        return importlib.metadata.version("caffe2jax")
    except importlib.metadata.PackageNotFoundError:
        return ""


@functools.cache
def _code() -> str:
    """caffe2jax's source files by path, size and mtime: an edited checkout is new code."""
    digest = hashlib.sha256()
    roots = {Path(sys.modules[name].__file__).parent for name in _PACKAGES
             if getattr(sys.modules.get(name), "__file__", None)}  # fmt: skip
    for root in sorted(roots):
        for path in sorted(root.rglob("*.py")):
            stat = path.stat()
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


@functools.cache
def _cpu() -> str:
    """The CPU's model and flags (an executable is compiled for the CPU it ran on)."""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return platform.processor()
    keep = [line for line in lines if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(keep)))


def environment_key() -> str:
    """Everything outside the net a cached value depends on (see the module docstring)."""
    import jaxlib

    config = {name: str(getattr(jax.config, name, None)) for name in _JAX_SETTINGS}
    devices = [f"{d.platform}:{d.device_kind}" for d in jax.devices()]
    parts = [version(), _code(), jax.__version__, jaxlib.__version__, json.dumps(config),
             os.environ.get("XLA_FLAGS", ""), json.dumps(devices), platform.machine(),
             _cpu()]  # fmt: skip
    return "\n".join(parts)


def _named_files(param: Any, out: list[str]) -> None:
    """The existing files the string fields of a LayerParameter name, with size and mtime."""
    for field, value in param.ListFields():
        values = value if field.is_repeated else [value]
        for item in values:
            if field.type == field.TYPE_MESSAGE:
                _named_files(item, out)
            elif field.type == field.TYPE_STRING and item and len(item) < 4096:
                try:
                    stat = os.stat(item)
                except (OSError, ValueError):
                    continue
                out.append(f"{item}\0{stat.st_size}\0{stat.st_mtime_ns}")


def net_key(net: Any, input_shapes: Mapping[str, Sequence[int]], settings: Sequence[Any]) -> (
    str | None
):  # fmt: skip
    """The key of ``net`` (an ir.Net) built for ``input_shapes`` with ``settings`` (dtype,
    precision, policy…, compared by their ``repr``); None when it must not be cached."""
    if not all(_ours(layer) for layer in net.layers):
        return None
    digest = hashlib.sha256(environment_key().encode())
    digest.update(
        repr(
            (
                net.name,
                net.phase,
                net.dialect,
                sorted((k, tuple(int(d) for d in v)) for k, v in input_shapes.items()),
                list(settings),
            )
        ).encode()
    )
    files: list[str] = []
    for layer in net.layers:
        head = (layer.name, layer.type, layer.form, layer.bottoms, layer.tops, layer.loss_weights,
                layer.propagate_down)  # fmt: skip
        digest.update(repr(head).encode())
        digest.update(layer.param.SerializeToString(deterministic=True))
        _named_files(layer.param, files)
    digest.update("\n".join(files).encode())
    return digest.hexdigest()


def _ours(layer: Any) -> bool:
    """Whether caffe2jax's own code lowers ``layer`` (not a Python layer, not a lowering a
    user registered)."""
    from caffe2jax.lowering.registry import lookup

    if layer.type == "Python":
        return False
    try:
        return lookup(layer).fn.__module__.startswith("caffe2jax.")
    except Exception:  # an unknown type: the build says so, nothing is kept
        return False


def model_key(model: Any) -> str | None:
    """:func:`net_key` of a built model (kept with its programs; None: not cached)."""
    if "startup key" not in model.programs:
        graph = model.graph  # the engine plan too: which form each layer runs in
        plan = (sorted(graph.engines.items()), sorted(graph.nhwc_layers))
        settings = (model.dtype.name, model.precision, model.policy, model.upto, plan)
        model.programs["startup key"] = net_key(model.net, model.inputs, settings)
    return model.programs["startup key"]


def _read(kind: str, key: str) -> bytes | None:
    root = folder()
    if root is None:
        return None
    try:
        return (root / kind / key).read_bytes()
    except OSError:
        return None


def _write(kind: str, key: str, data: bytes) -> None:
    root = folder()
    if root is None:
        return
    try:
        (root / kind).mkdir(parents=True, exist_ok=True)
        atomic_write(root / kind / key, data)
    except Exception as err:  # a cache that cannot be written is no cache, not an error
        log.info("startup cache: cannot write %s/%s: %s", kind, key, err)


# -- shapes ------------------------------------------------------------------------------------


def known_tops(key: str | None) -> dict[str, list[tuple[int, ...]]] | None:
    """The top shapes by layer name kept under ``key`` (None: none kept, or unreadable)."""
    data = _read("shapes", key) if key else None
    if data is None:
        return None
    try:
        return {name: [tuple(int(d) for d in s) for s in tops]
                for name, tops in json.loads(data).items()}  # fmt: skip
    except (ValueError, TypeError, AttributeError) as err:
        log.info("startup cache: shapes %s unreadable (%s); inferring them", key, err)
        return None


def top_shapes(net: Any) -> dict[str, list[tuple[int, ...]]]:
    """Each layer's top shapes (by layer name) of a built net (an ir.Net with its shapes)."""
    return {layer.name: [tuple(net.shapes[t]) for t in layer.tops] for layer in net.layers}


def keep_tops(key: str | None, tops: Mapping[str, Sequence[Sequence[int]]]) -> None:
    """Keep a net's top shapes by layer name under ``key`` (nothing when None or kept)."""
    root = folder()
    if key and root is not None and not (root / "shapes" / key).exists():
        text = json.dumps({name: [list(s) for s in shapes] for name, shapes in tops.items()})
        _write("shapes", key, text.encode())


# -- programs ----------------------------------------------------------------------------------


def _signature(args: tuple) -> str:
    """The tree and the abstract values of a call's arguments (what an executable takes)."""
    leaves, tree = jax.tree.flatten(args)
    avals = [(getattr(x, "shape", None), str(getattr(x, "dtype", type(x).__name__)),
              bool(getattr(x, "weak_type", False))) for x in leaves]  # fmt: skip
    return f"{tree}\n{avals}"


class Program:
    """A jitted function whose traced and lowered form for its first call's arguments is
    loaded from the cache (a ``jax.export`` serialization; its compile then comes from JAX's
    persistent cache), or exported and kept there. Calls with other arguments, or that the
    kept program refuses, go to the jitted function (the same program)."""

    def __init__(self, jitted: Any, key: str):
        self.jitted, self.key = jitted, key
        self.compiled: Any = None
        self.signature: str | None = None
        self.loaded = False  # whether the program came from the cache
        self.tiered: Any = None  # not loaded: first_run.Tiered, or the jitted program

    def __call__(self, *args: Any) -> Any:
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)):
            return self.jitted(*args)  # inside a caller's trace: traced into its program
        if self.signature is None:
            self.signature = _signature(args)
            exported = self._exported(args)
            self.compiled = None if exported is None else _jitted_call(exported)
        if self.compiled is not None and _signature(args) == self.signature:
            try:
                if not self.loaded and self.tiered is None:  # a first run: quick, then optimised
                    self.tiered = first_run.first_call(self.compiled, args) or self.compiled
                return (self.tiered or self.compiled)(*args)
            except (TypeError, ValueError) as err:  # refused before running: nothing ran
                log.info("startup cache: the kept program refused its arguments (%s)", err)
                self.compiled = self.tiered = None
        return self.jitted(*args)

    def _exported(self, args: tuple) -> Any:
        key = hashlib.sha256(f"{self.key}\n{self.signature}".encode()).hexdigest()
        data = _read("programs", key)
        if data is not None:
            try:
                exported = jax.export.deserialize(bytearray(data))
                self.loaded = True
                return exported
            except Exception as err:  # another JAX, a damaged file: export it again
                log.warning("startup cache: program %s does not load (%s); tracing it", key, err)
        try:
            exported = jax.export.export(self.jitted, disabled_checks=_FOREIGN_CALLS)(*args)
            data = exported.serialize()
        except Exception as err:  # host callbacks, a custom call export refuses: not kept
            log.info("startup cache: program %s not kept (%s)", key, err)
            return None
        _write("programs", key, bytes(data))
        return exported


def _jitted_call(exported: Any) -> Any:
    """``exported`` as a jitted function, its inputs and outputs placed on the default device:
    a call's inputs are a first forward's uncommitted arrays, then the committed outputs of
    the last one, and without fixed placements each kind would compile its own program."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.jit(exported.call, in_shardings=device, out_shardings=device)


def program(jitted: Any, key: str | None, name: Any) -> Callable:
    """``jitted`` (a ``jax.jit`` function) with its executable kept under ``key`` (a
    :func:`net_key`) and ``name`` (which program of the net); ``jitted`` itself when ``key``
    is None, the cache is off or the process sees several devices (a program's placement is
    then the caller's)."""
    if key is None or folder() is None or jax.device_count() > 1:
        return jitted
    return Program(jitted, hashlib.sha256(f"{key}\n{name!r}".encode()).hexdigest())
