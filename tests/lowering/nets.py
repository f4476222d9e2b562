"""Small nets for the layer families' own tests. Forwards run under ``jax.jit`` and gradients
as ``value_and_grad`` of a loss under ``jax.jit``, the path users run (tests/jitted.py)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from caffe2jax.lowering.model import Model
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted


def one_layer(body: str, inputs: dict[str, tuple[int, ...]], phase: str = "TEST") -> Model:
    """A net: one Input layer with ``inputs`` then the layer ``body`` (named "layer")."""
    tops = "".join(f'  top: "{name}"\n' for name in inputs)
    shapes = "".join(
        "    shape { " + " ".join(f"dim: {d}" for d in shape) + " }\n" for shape in inputs.values()
    )
    text = (
        "force_backward: true\n"
        f'layer {{\n  name: "input"\n  type: "Input"\n{tops}  input_param {{\n{shapes}  }}\n}}\n'
        f'layer {{\n  name: "layer"\n{body}\n}}\n'
    )
    return compile_net(text, phase=phase)


def net_text(kind, shapes, param="", tops=("y",), bottoms=("x", "ref")):
    """Input (one top per shape) → one ``kind`` layer named 'layer'."""
    names = bottoms[: len(shapes)]
    input_tops = "".join(f'top: "{n}" ' for n in names)
    input_shapes = "".join("shape { " + "".join(f"dim: {d} " for d in s) + "} " for s in shapes)
    layer_bottoms = "".join(f'bottom: "{n}" ' for n in names)
    layer_tops = "".join(f'top: "{t}" ' for t in tops)
    return (
        "force_backward: true\n"
        f'layer {{ name: "input" type: "Input" {input_tops} input_param {{ {input_shapes} }} }}\n'
        f'layer {{ name: "layer" type: "{kind}" {layer_bottoms} {layer_tops} {param} }}\n'
    )


def run(text, inputs, params=None, phase="TEST", rng=None):
    """Compile and run; returns (model, blobs)."""
    model = compile_net(text, phase=phase)
    init, state = model.init(0)
    if params is not None:
        init["layer"] = [jnp.asarray(p) for p in params]
    blobs, _ = jitted.forward(model, init, state, inputs, rng)
    return model, blobs


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def apply(model, inputs, params=None, state=None):
    """Forward: (blobs, new state)."""
    p0, s0 = model.init(0)
    inputs = {k: jnp.asarray(v, jnp.float32) for k, v in inputs.items()}
    return jitted.forward(
        model, p0 if params is None else params, s0 if state is None else state, inputs
    )


def grads(model, inputs, top, cotangent=1.0, params=None):
    """(top value, d(cotangent·top)/d inputs) — the diffs Caffe leaves in the bottoms."""
    p0, s0 = model.init(0)
    params = p0 if params is None else params

    def f(x):
        return model.apply(params, s0, x)[0][top]

    x = {k: jnp.asarray(v, jnp.float32) for k, v in inputs.items()}
    value, (grad,) = jitted.vjp(f, [x], cotangent)
    return np.asarray(value), {k: np.asarray(v) for k, v in grad.items()}


def loss_layer(type_name: str, params: str, inputs: dict, tops=("loss",)):
    bottoms = "".join(f'  bottom: "{n}"\n' for n in inputs)
    top_lines = "".join(f'  top: "{t}"\n' for t in tops)
    body = f'  type: "{type_name}"\n{bottoms}{top_lines}  {params}'
    return one_layer(body, {k: np.shape(v) for k, v in inputs.items()})


def softmax_np(x, axis=1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def forward(model, inputs, params=None, rng=None):
    """Forward from fresh (or the given) params: the blobs."""
    if params is None:
        params, _ = model.init(0)
    _, state = model.init(0)
    blobs, _ = jitted.forward(model, params, state, inputs, rng)
    return blobs


def input_grad(model, inputs, top, cotangent, params=None, rng=None):
    """The diffs Caffe's backward leaves in the inputs for ``cotangent`` on ``top``."""
    if params is None:
        params, _ = model.init(0)
    _, state = model.init(0)

    def f(inputs):
        return model.apply(params, state, inputs, rng)[0][top]

    _, (grad,) = jitted.vjp(f, [{k: jnp.asarray(v) for k, v in inputs.items()}], cotangent)
    return grad
