"""Small nets for the layer families' own tests."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from caffe2jax.lowering.model import Model
from caffe2jax.lowering.model import compile as compile_net


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
    blobs, _ = model.apply(init, state, inputs, rng)
    return model, blobs


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
