"""The functional API: ``compile`` a prototxt into a :class:`Model` of pure JAX functions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from caffe2jax.frontend import ir
from caffe2jax.frontend.pipeline import NetSource, load_net
from caffe2jax.lowering.engines.policy import EnginePolicy
from caffe2jax.lowering.engines.precision import PRECISIONS, Precision, default_precision
from caffe2jax.lowering.graph import Graph, Params

__all__ = ["PRECISIONS", "EnginePolicy", "Model", "compile", "default_precision"]


class Model:
    """A compiled Caffe net.

    ``net`` is the IR (with every blob's shape), ``inputs`` maps input blob names to shapes,
    ``outputs`` lists the blobs no layer consumes. ``init``, ``apply`` and ``loss`` are pure
    functions of their arguments, ready for ``jax.jit``, ``jax.grad`` and ``jax.vmap``.

    ``precision`` (``"fp32"``, ``"tf32"`` or ``"bf16"``; default: the enclosing
    :func:`default_precision` scope, else fp32) is how the layers compute; params, state,
    gradients and returned blobs stay in ``dtype``. ``policy`` (an :class:`EnginePolicy`;
    default: :meth:`EnginePolicy.from_env`, the environment switches read now) picks the engine
    of each convolution and pooling and whether the internal NHWC pass runs; ``channels_last``
    overrides the latter. Blobs and params keep Caffe's layout either way.
    """

    def __init__(
        self,
        net: ir.Net,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        dtype: Any = jnp.float32,
        precision: str | Precision | None = None,
        channels_last: bool | None = None,
        policy: EnginePolicy | None = None,
    ):
        self.graph = Graph(net, input_shapes, dtype, precision, channels_last, policy)

    @property
    def net(self) -> ir.Net:
        return self.graph.net

    @property
    def inputs(self) -> dict[str, tuple[int, ...]]:
        return dict(self.graph.inputs)

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.graph.net.outputs

    @property
    def dtype(self) -> Any:
        return self.graph.dtype

    @property
    def precision(self) -> str:
        return self.graph.precision.name

    @property
    def policy(self) -> EnginePolicy:
        return self.graph.policy

    def init(self, key: jax.Array | int = 0) -> tuple[Params, Params]:
        """Params and state drawn from each blob's Caffe filler."""
        if isinstance(key, int):
            key = jax.random.key(key)
        return self.graph.init(key)

    def apply(
        self,
        params: Params,
        state: Params,
        inputs: Mapping[str, Any],
        rng: jax.Array | None = None,
    ) -> tuple[dict[str, jax.Array], Params]:
        """Forward: every blob (user names for final versions) and the updated state."""
        return self.graph.apply(params, state, inputs, rng)

    def loss(
        self,
        params: Params,
        state: Params,
        inputs: Mapping[str, Any],
        rng: jax.Array | None = None,
    ) -> tuple[jax.Array, tuple[dict[str, jax.Array], Params]]:
        """Caffe's net objective and ``(blobs, state)``: use with value_and_grad(has_aux=True)."""
        blobs, state = self.graph.apply(params, state, inputs, rng)
        return self.graph.objective(blobs), (blobs, state)

    def reshape(self, input_shapes: Mapping[str, Sequence[int]]) -> Model:
        """The same net compiled for other input shapes (params must still fit)."""
        return Model(self.graph.net, {**self.inputs, **input_shapes}, self.dtype,
                     self.graph.precision, policy=self.graph.policy)  # fmt: skip


def compile(  # noqa: A001 - the design card's name for it
    source: NetSource,
    phase: str = ir.TEST,
    level: int = 0,
    stages: Iterable[str] = (),
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dtype: Any = jnp.float32,
    precision: str | None = None,
    policy: EnginePolicy | None = None,
) -> Model:
    """Compile a net prototxt (path, text, bytes or NetParameter) for a phase/level/stages,
    computing in ``precision`` with the engines ``policy`` picks (see :class:`Model`)."""
    net = load_net(source, phase, level, stages)
    return Model(net, input_shapes, dtype, precision, policy=policy)
