"""Every ``CAFFE2JAX_*`` environment variable caffe2jax reads: declared in :data:`VARIABLES` (the
table docs/environment.md shows, checked against it by tests/frontend/test_environment.py) and
read through :func:`value`, nowhere else.

It imports nothing of caffe2jax and sits at the bottom of the pipeline (frontend/) so that every
stage may import it: the engine policy (lowering/engines/policy.py) and the runtime alike — and
the runtime's compilation cache, which reads its switches while ``caffe2jax.lowering`` itself is
being imported (caffe2jax/__init__.py), without importing that package first. Each setting is
read when it is used (the engine policy once per compiled net, the data pipeline when it starts
its workers…), so a variable set before then takes effect. Parsing and checking a value stay
with the module that uses it, which names the variable in its error.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Variable:
    """One environment variable: its values (the default first), what it sets, and the module
    that reads it."""

    name: str
    values: str
    meaning: str
    reader: str


_ALL = (
    Variable("CAFFE2JAX_CPU_CONV", "`auto`, `onednn`, `onednn-all`, `xla`",
             "which engine convolves on the CPU (the engine policy's `conv`; "
             "docs/performance.md \"Engine switches\")", "lowering/engines/policy.py"),
    Variable("CAFFE2JAX_POOL", "`auto`, `phases`, `xla`",
             "the form of MAX/AVE pooling (the engine policy's `pool`)",
             "lowering/engines/policy.py"),
    Variable("CAFFE2JAX_CHANNELS_LAST", "`1`, `0` (also true/false, yes/no, on/off)",
             "the channels-last (NHWC) pass (the engine policy's `channels_last`)",
             "lowering/engines/policy.py"),
    Variable("CAFFE2JAX_ONEDNN_LIB", "unset: the environment's `lib/libdnnl.so.3`",
             "the path of oneDNN's `libdnnl.so.3`, read when oneDNN is first loaded",
             "lowering/engines/onednn.py"),
    Variable("CAFFE2JAX_MAX_SHAPES", "`16`, or any count ≥ 1",
             "how many input shape signatures a net keeps compiled (least recently used "
             "dropped)", "lowering/shape_cache.py"),
    Variable("CAFFE2JAX_NO_COMPILE_CACHE", "unset, or anything but `0` to turn it off",
             "turns JAX's persistent compilation cache and the start-up cache beside it off (as "
             "`--no-compile-cache`)",
             "runtime/host/compile_cache.py"),
    Variable("CAFFE2JAX_CACHE_DIR",
             "unset: the OS's user cache folder + `caffe2jax/xla` (`~/.cache/caffe2jax/xla` on "
             "Linux)",
             "the folder of the compilation cache", "runtime/host/compile_cache.py"),
    Variable("CAFFE2JAX_QUICK_FIRST_RUN", "unset or `1`: on; `0`: off",
             "a big program's first run on the CPU: its first calls run an executable compiled "
             "at LLVM -O0 with XLA's elemental emitter; the optimised one compiles in the "
             "background once the first call has its result (within float rounding)",
             "runtime/host/first_run.py"),
    Variable("CAFFE2JAX_DEFAULT_JAX_CACHE_DIR", "set by caffe2jax, not by users",
             "marks `JAX_COMPILATION_CACHE_DIR` as caffe2jax's default (not the user's "
             "choice) for child processes", "runtime/host/compile_cache.py"),
    Variable("CAFFE2JAX_DATA_WORKERS", "unset: the cores the process may use, or a count ≥ 0",
             "the data pipeline's decode threads (as `train --data_workers`)",
             "runtime/data/workers.py"),
    Variable("CAFFE2JAX_IMAGE_DECODER", "unset (OpenCV where installed), `cv2`, `pil`",
             "which library decodes images", "runtime/data/transform/image.py"),
    Variable("CAFFE2JAX_MAX_IMAGE_PIXELS", "`268435456` (2^28), or a count",
             "the largest image decoded; a larger one is refused naming its record",
             "runtime/data/transform/image_header.py"),
    Variable("CAFFE2JAX_PYTHON_LAYERS", "`auto`, `builtin`, `user`",
             "which implementation runs a fork's Python layer caffe2jax has built in: the "
             "user's module when it imports (`auto`), caffe2jax's always (`builtin`), the "
             "user's always (`user`); `caffe2jax.Net(..., python_layers=)` wins over it "
             "(docs/forks.md)", "lowering/python_layer.py"),
    Variable("CAFFE2JAX_CGROUP_DIR", "unset: the process's own cgroup",
             "a memory cgroup folder to read the memory limit from instead (tests)",
             "runtime/host/memory.py"),
)  # fmt: skip

#: The variables by name, in the order docs/environment.md lists them.
VARIABLES: Mapping[str, Variable] = MappingProxyType({v.name: v for v in _ALL})


def value(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The user's setting of variable ``name`` as written (``""`` when unset), from
    ``environ`` or the process's environment. ``name`` must be one of :data:`VARIABLES`
    (KeyError otherwise), so every variable read is in the table."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not declared in caffe2jax.frontend.environment")
    return (os.environ if environ is None else environ).get(name, "")
