"""A big program's first run on the CPU: its first result from a quickly compiled executable
while the optimised one compiles in a background thread.

What a pycaffe script's first run waits for is XLA:CPU compiling the net (GoogLeNet: 40–60 %
of launch → first output, docs/performance.md "Start-up"). The same HLO compiled with
:data:`QUICK_OPTIONS` — LLVM -O0 and XLA's elemental kernel emitter instead of its MLIR fusion
emitters, whose per-kernel MLIR pipeline was most of an -O0 compile (GoogLeNet b10: 3.7 s
instead of 9.6 s, against 30 s optimised; load 8–11) — runs its elementwise kernels
unvectorised (GoogLeNet b10's forward ≈ 3× slower; the convolutions and matrix products are
library calls at any level): cheaper than the optimised compile for a first result. So the
first call of a :class:`Tiered` program compiles that quick executable and runs it, and once
its result is ready a background thread compiles the optimised executable (started beside the
run, the compile slowed it 1.3–2×: :data:`START_AFTER_FIRST_CALL`), written to JAX's
persistent cache as every compile is, so a second run of the script loads it; later calls run
the quick one until the optimised one is ready, then the optimised one. Both executables come
from one lowered module, the same operations in the same order, but not always to the last bit: at
-O2 LLVM contracts a product and a sum into one fused multiply-add where -O0 rounds twice, and
the elemental emitter has its own tanh, rsqrt, log1p and cbrt. Each operation stays within
float rounding (≤ 8 ulp measured, tanh; most 0–2), which tests/runtime/host/test_first_run.py
checks; GoogLeNet's outputs and the test's inception-like net's are bit-identical. The thread
is not a daemon: a script that ends first waits for it, and the optimised executable reaches
the cache.

Only programs with at least :data:`MIN_OPS` operations take this path (a small net's compile
is short, and compiling it twice would only cost time); ``CAFFE2JAX_QUICK_FIRST_RUN=0`` turns it
off, as does the start-up cache's switch (``CAFFE2JAX_NO_COMPILE_CACHE=1``): it is the first run
of a :class:`~caffe2jax.runtime.host.startup_cache.Program`.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import jax

from caffe2jax.frontend import environment

log = logging.getLogger("caffe2jax.startup")

SWITCH_ENV = "CAFFE2JAX_QUICK_FIRST_RUN"
# LLVM -O0, XLA's elemental emitter (see the module docstring); an XLA that refuses the second
# option gets the first alone (:data:`FALLBACK_OPTIONS`)
QUICK_OPTIONS = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
FALLBACK_OPTIONS = {"xla_backend_optimization_level": 0}
# the optimised compile starts once the first call's result is ready (it would share the cores
# with that call's run)
START_AFTER_FIRST_CALL = True
# StableHLO operations from which a program takes the quick executable first (GoogLeNet's
# forward has 1,116; the test suite's small nets tens)
MIN_OPS = 400


def big(lowered: Any) -> bool:
    """Whether a lowered program has at least :data:`MIN_OPS` operations."""
    return lowered.as_text().count(" = stablehlo.") >= MIN_OPS


class Tiered:
    """A jitted function's executable for one argument signature, quick first, optimised
    once the background compile is done (see the module docstring). Call it with arguments of
    the signature it was made for."""

    def __init__(self, lowered: Any):
        try:
            self.quick = lowered.compile(QUICK_OPTIONS)
        except Exception as err:  # an XLA without the emitter switch: -O0 alone
            log.info("first run: quick options refused (%s); LLVM -O0 alone", err)
            self.quick = lowered.compile(FALLBACK_OPTIONS)
        self.optimised: Any = None
        self.failed: str | None = None
        self.thread = threading.Thread(target=self._compile, args=(lowered,),
                                       name="caffe2jax-compile")  # fmt: skip
        self._starting = threading.Lock()
        if not START_AFTER_FIRST_CALL:
            self._start()

    def _start(self) -> None:
        """Start the optimised compile unless it was started (by another caller's thread)."""
        with self._starting:
            if self.thread.ident is None:
                self.thread.start()

    def _compile(self, lowered: Any) -> None:
        try:
            self.optimised = lowered.compile()
        except Exception as err:  # the quick executable serves every call then
            self.failed = str(err)
            log.warning("first run: the optimised compile failed (%s); running unoptimised", err)

    def __call__(self, *args: Any) -> Any:
        run = self.optimised if self.optimised is not None else self.quick
        out = run(*args)
        if self.thread.ident is None:  # the first call
            jax.block_until_ready(out)  # its result before the cores go to the compile
            self._start()
        return out

    def wait(self) -> None:
        """Block until the optimised executable is compiled (or its compile failed)."""
        self._start()  # never called: compile it now
        self.thread.join()


def first_call(jitted: Any, args: tuple) -> Any:
    """A :class:`Tiered` executable of ``jitted`` for ``args`` when the backend is the CPU and
    the program is big; None otherwise (the caller runs ``jitted`` as usual)."""
    if jax.default_backend() != "cpu" or environment.value(SWITCH_ENV).strip() == "0":
        return None
    lowered = jitted.lower(*args)
    if not big(lowered):
        return None
    try:
        return Tiered(lowered)
    except Exception as err:  # an XLA that refuses the option: compile as usual
        log.info("first run: no quick executable (%s)", err)
        return None
