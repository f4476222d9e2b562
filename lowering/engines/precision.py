"""Compute precision of a lowered net: ``fp32`` (Caffe's), ``tf32`` or ``bf16``.

Params, state, inputs and everything the solver keeps stay in the net's dtype (fp32): the
precision only changes how layers compute inside ``Graph.run``.

* ``fp32``: matmuls and convolutions at full float32 precision (``"highest"``; on GPUs JAX's
  default would be TF32).
* ``tf32``: float32 storage, TensorFloat-32 matmuls and convolutions where the hardware has
  them (Ampere and later GPUs); the same as fp32 on CPU.
* ``bf16``: the layer types registered ``bf16=True`` (lowering/registry.py: convolutions,
  inner products and the layers that only move, select or rectify their values, with no sums
  that lose accuracy in 8 mantissa bits) receive their bottoms and param blobs cast to
  bfloat16 and produce bfloat16 tops; every other layer (losses, softmax, normalisation,
  accuracy…) casts its bottoms back to float32. The casts are inside the differentiated
  function, so gradients reach the float32 master params as float32 and the solver history
  stays float32. No loss scaling is applied: bfloat16 has float32's 8-bit exponent, so
  gradients that fp16 would flush to zero stay representable (only mantissa bits are lost).

A net's precision is one explicit value, like its engine policy: ``Model(..., precision=)`` /
``compile(..., precision=)``, carried to every shape it is reshaped to, and the solver's
``SolverLoop(..., precision=)`` for the nets it builds (the CLI's ``--precision``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp

from caffe2jax.frontend.errors import NetError

PRECISIONS = ("fp32", "tf32", "bf16")

_MATMUL = {"fp32": "highest", "tf32": "tensorfloat32", "bf16": "default"}


@dataclass(frozen=True)
class Precision:
    """A checked precision name and what it means for a net's layers."""

    name: str = "fp32"

    def __post_init__(self):
        if self.name not in PRECISIONS:
            raise NetError(f"unknown precision '{self.name}'; supported: {', '.join(PRECISIONS)}")

    @property
    def matmul(self) -> str:
        """The ``jax.default_matmul_precision`` layers are traced under."""
        return _MATMUL[self.name]

    def layer_dtype(self, bf16: bool, dtype: Any) -> Any:
        """The dtype a layer computes in, for a net of ``dtype`` (``bf16``: its type is
        registered as computing in bfloat16 under this precision)."""
        if self.name == "bf16" and bf16:
            return jnp.dtype(jnp.bfloat16)
        return dtype

    @property
    def casts(self) -> bool:
        return self.name == "bf16"


def cast(x: Any, dtype: Any) -> Any:
    """``x`` in ``dtype`` if it is a floating array of another float type, else unchanged."""
    if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
        return x.astype(dtype)
    return x


def resolve(name: str | Precision | None) -> Precision:
    """``name`` checked (None: fp32, Caffe's)."""
    if isinstance(name, Precision):
        return name
    return Precision(name if name is not None else "fp32")
