"""The path users run, for the parity tests.

Every user path is compiled: ``caffe2jax train``'s step, ``test``, ``detect``, pycaffe's
``Net.forward``. XLA rewrites what it compiles (``x / c`` becomes ``x · (1/c)``, ``a·b + c`` one
fused multiply-add), so a layer can agree with Caffe eagerly and not under ``jax.jit``. The parity
helpers therefore run a net's forward under ``jax.jit`` (:func:`forward`) and take gradients as
the compiled train step does, ``jax.value_and_grad`` of a loss under ``jax.jit``
(:func:`value_and_grad`, :func:`vjp`). A test that wants the eager path calls ``model.apply``
itself and says why in a comment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

_FORWARD = ("tests.jitted", "forward")


def forward(model, params, state, inputs, rng=None) -> tuple[dict[str, jax.Array], Any]:
    """``model.apply`` under ``jax.jit`` (one compiled program per model, kept with it)."""
    run = model.programs.get(_FORWARD)
    if run is None:
        run = model.programs[_FORWARD] = jax.jit(model.apply)
    return run(params, state, inputs, rng)


def value_and_grad(fn: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False):
    """``jax.jit(jax.value_and_grad(fn, ...))``: the gradient the compiled train step takes."""
    return jax.jit(jax.value_and_grad(fn, argnums=argnums, has_aux=has_aux))


def vjp(fn: Callable, primals: Sequence[Any], cotangents: Any) -> tuple[Any, tuple]:
    """``(fn(*primals), Caffe's backward of fn for the top diffs cotangents)`` under ``jax.jit``
    (the gradient of ``Σ cotangent · fn`` the compiled train step takes; integer primals get
    float0 diffs). ``fn`` returns an array or a list of arrays matching ``cotangents``."""

    def run(primals, cotangents):
        out, pullback = jax.vjp(fn, *primals)
        many = isinstance(out, list | tuple)
        outs, diffs = (out, cotangents) if many else ([out], [cotangents])
        cts = [jnp.broadcast_to(jnp.asarray(c, o.dtype), o.shape) for o, c in zip(outs, diffs)]
        return out, pullback(type(out)(cts) if many else cts[0])

    return jax.jit(run)(list(primals), cotangents)
