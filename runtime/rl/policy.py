"""The policy net of MyCaffe's policy-gradient trainer, found in an ordinary Caffe net.

Reproduced behaviour (MyCaffe/MyCaffe, ``MyCaffe.trainers/pg.st/TrainerPG.cs``, class
``Brain``):

* the net must hold a MemoryData layer (the observation input) and a MemoryLoss layer (where
  the trainer injects its gradient) — "Could not find the MemoryData/MemoryLoss Layer!";
* the action probabilities are a net output that is not a loss: with a Sigmoid it is one value,
  ``Aprob = P(action 0)``, and there are 2 actions; with a Softmax there is one probability per
  action;
* the gradient is set as the diff of MemoryLoss's bottom 0 and back-propagated from there. In
  MyCaffe's Cart-Pole nets (``MyCaffe.test/test_data/models/reinforcement/cartpole/
  train_val_sigmoid.prototxt``) that bottom is the last InnerProduct's output (the logits) and
  the Sigmoid is a side branch, so the gradient does not pass through the Sigmoid's backward;
  a net wiring MemoryLoss after the Sigmoid/Softmax gets that layer's backward as Caffe would.

The net is evaluated row by row: row ``i`` of the MemoryData input is one step's observation.
Layers that mix rows (BatchNorm in TRAIN phase) would see a batch of steps, not one step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from caffe2jax.frontend import ir
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.lowering.forks import mycaffe as memory_loss
from caffe2jax.lowering.graph import Params
from caffe2jax.lowering.model import Model
from caffe2jax.lowering.util import count

SIGMOID, SOFTMAX = "sigmoid", "softmax"


class RLError(CaffeError):
    """A net, environment or option the policy-gradient trainer cannot run."""


@dataclass(frozen=True)
class PolicySpec:
    """Where the trainer reads and writes the net (blob ids are SSA ids)."""

    data: str  # user name of MemoryData's data top
    extra_inputs: tuple[tuple[str, tuple[int, ...]], ...]  # other MemoryData tops, per-row shape
    step_shape: tuple[int, ...]  # one observation as the net takes it, e.g. (4, 1, 1)
    prob_blob: str
    kind: str  # SIGMOID or SOFTMAX
    num_actions: int
    loss_layer: str
    loss_bottom: str
    per_step: int  # MemoryLoss normaliser: per_step · T when by_length, else 1
    by_length: bool
    loss_weight: float
    prob_bottom: str = ""  # SSA id of the Sigmoid/Softmax's bottom

    @property
    def probs_differentiable(self) -> bool:
        """The action probabilities follow from MemoryLoss's bottom (the blob Caffe
        back-propagates from): it is the probabilities, or the logits they are taken of."""
        return self.loss_bottom in (self.prob_blob, self.prob_bottom)


def _only(net: ir.Net, type_name: str) -> ir.Layer:
    found = [layer for layer in net.layers if layer.type == type_name]
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise RLError(
            f"the policy net '{net.name}' has {what} {type_name} layer(s); MyCaffe's "
            f"policy-gradient trainer needs exactly one {type_name} layer"
        )
    return found[0]


def _prob_layer(net: ir.Net, loss: ir.Layer) -> tuple[ir.Layer, str]:
    """The Sigmoid/Softmax whose top holds the action probabilities."""
    producer = net.producer()
    feeding = producer.get(loss.bottoms[0])
    if feeding is not None and feeding.type in ("Sigmoid", "Softmax"):
        return feeding, loss.bottoms[0]
    loss_tops = {t for layer in net.layers for t, w in zip(layer.tops, layer.loss_weights) if w}
    found = []
    for user in net.outputs:
        ssa = net.blob_names[user]
        layer = producer[ssa]
        if ssa not in loss_tops and layer.type in ("Sigmoid", "Softmax"):
            found.append((layer, ssa))
    if len(found) != 1:
        raise RLError(
            f"the policy net '{net.name}' needs exactly one action-probability output from a "
            f"Sigmoid (2 actions) or Softmax (n actions) layer; found {len(found)}"
        )
    return found[0]


def _actions(layer: ir.Layer, shape: tuple[int, ...]) -> tuple[str, int]:
    per_row = count(shape, 1)
    if layer.type == "Sigmoid":
        if per_row != 1:
            raise RLError(
                f"layer '{layer.name}' (Sigmoid) must output one value per step, P(action 0), "
                f"for 2 actions; it outputs {per_row}"
            )
        return SIGMOID, 2
    axis = layer.param.softmax_param.axis % len(shape)
    if axis != 1 or per_row != shape[1]:
        raise RLError(
            f"layer '{layer.name}' (Softmax) must output (steps, actions); got {list(shape)} "
            f"with axis {layer.param.softmax_param.axis}"
        )
    return SOFTMAX, per_row


def inspect_policy(model: Model) -> PolicySpec:
    """Find MemoryData, MemoryLoss and the action probabilities in a compiled model."""
    net = model.net
    data_layer = _only(net, "MemoryData")
    loss = _only(net, "MemoryLoss")
    sources = [n for n in model.inputs if n not in data_layer.top_names]
    if sources:
        raise RLError(
            f"the policy net '{net.name}' takes input blob(s) {', '.join(sources)} besides its "
            "MemoryData layer; the trainer feeds only MemoryData"
        )
    prob_layer, prob_blob = _prob_layer(net, loss)
    kind, num_actions = _actions(prob_layer, net.shapes[prob_blob])
    bottom_shape = net.shapes[loss.bottoms[0]]
    if count(bottom_shape, 1) != (1 if kind == SIGMOID else num_actions):
        raise RLError(
            f"MemoryLoss '{loss.name}' bottom '{loss.bottom_names[0]}' has {list(bottom_shape)}: "
            f"it needs one value per action (or one for a Sigmoid policy) per step"
        )
    per_step, by_length = memory_loss.length_normalizer(loss, bottom_shape[1:])
    data = data_layer.top_names[0]
    extra = tuple((n, tuple(model.inputs[n][1:])) for n in data_layer.top_names[1:])
    return PolicySpec(
        data=data,
        extra_inputs=extra,
        step_shape=tuple(model.inputs[data][1:]),
        prob_blob=prob_blob,
        kind=kind,
        num_actions=num_actions,
        loss_layer=loss.name,
        loss_bottom=loss.bottoms[0],
        per_step=per_step,
        by_length=by_length,
        loss_weight=float(loss.loss_weights[0]),
        prob_bottom=prob_layer.bottoms[0],
    )


class PolicyNet:
    """The compiled policy net applied to any number of rows (steps) at once."""

    def __init__(self, model: Model):
        self.model = model
        self.spec = inspect_policy(model)
        self._by_rows: dict[int, Model] = {}

    @property
    def obs_size(self) -> int:
        return count(self.spec.step_shape)

    def rows(self, n: int) -> Model:
        """The model compiled for ``n`` rows (cached)."""
        if n not in self._by_rows:
            spec = self.spec
            shapes = {spec.data: (n, *spec.step_shape)}
            shapes.update({name: (n, *shape) for name, shape in spec.extra_inputs})
            self._by_rows[n] = self.model.reshape(shapes)
        return self._by_rows[n]

    def blobs(self, params: Params, state: Params, x: jax.Array) -> dict[str, jax.Array]:
        """Every blob of the net (by SSA id) for observations ``x`` of shape (rows, obs_size)."""
        n = x.shape[0]
        spec = self.spec
        inputs: dict[str, Any] = {spec.data: x.reshape(n, *spec.step_shape)}
        for name, shape in spec.extra_inputs:
            inputs[name] = jnp.zeros((n, *shape), x.dtype)
        return self.rows(n).apply(params, state, inputs)[0]

    def forward(self, params: Params, state: Params, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(probs, bottom)`` for observations ``x`` of shape (rows, obs_size).

        ``probs`` is (rows, 1) holding P(action 0) for a Sigmoid policy, (rows, n) for Softmax;
        ``bottom`` is MemoryLoss's bottom 0 flattened to (rows, k).
        """
        n, spec = x.shape[0], self.spec
        blobs = self.blobs(params, state, x)
        return blobs[spec.prob_blob].reshape(n, -1), blobs[spec.loss_bottom].reshape(n, -1)

    def value_blob(self, name: str) -> tuple[str, float]:
        """The SSA id and loss weight of the value head ``name`` (rl_param update
        ``value_blob``): a top of the net with one value per step and a non-zero
        ``loss_weight`` (Caffe back-propagates only into outputs with one), other than the
        action probabilities, their logits and MemoryLoss (one-line RLErrors otherwise)."""
        net, spec = self.model.net, self.spec
        if name not in net.blob_names:
            raise RLError(
                f"rl_param update value_blob '{name}' is not a blob of the policy net '{net.name}'"
            )
        ssa = net.blob_names[name]
        weights = {t: w for layer in net.layers for t, w in zip(layer.tops, layer.loss_weights)}
        taken = {spec.prob_blob, spec.loss_bottom, spec.prob_bottom}
        taken.update(t for layer in net.layers if layer.type == "MemoryLoss" for t in layer.tops)
        shape = net.shapes[ssa]
        if ssa in taken or count(shape, 1) != 1:
            raise RLError(
                f"rl_param update value_blob '{name}' {list(shape)} must hold one value per "
                "step, apart from the action probabilities, their logits and MemoryLoss"
            )
        if not weights.get(ssa):
            raise RLError(
                f"rl_param update value_blob '{name}' needs a loss_weight in the net (the "
                "value loss's weight; Caffe back-propagates only into outputs with one)"
            )
        return ssa, float(weights[ssa])

    def probs_of_bottom(self, bottom: jax.Array) -> jax.Array:
        """The action probabilities as a differentiable function of MemoryLoss's bottom rows
        (Caffe computes no diff on the Sigmoid/Softmax side branch, so :meth:`forward`'s
        ``probs`` carry no gradient): the bottom itself, or its sigmoid/softmax."""
        self.require_differentiable()
        spec = self.spec
        if spec.loss_bottom == spec.prob_blob:
            return bottom
        if spec.kind == SIGMOID:
            return jax.nn.sigmoid(bottom)
        return jax.nn.softmax(bottom, axis=-1)

    def require_differentiable(self) -> None:
        """An RLError unless :meth:`probs_of_bottom` can run on this net."""
        spec = self.spec
        if not spec.probs_differentiable:
            raise RLError(
                f"MemoryLoss '{spec.loss_layer}' reads neither the action probabilities nor "
                "the logits they are taken of; TRPO and PPO differentiate the probabilities "
                "through MemoryLoss's bottom"
            )
