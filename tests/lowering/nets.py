"""Small nets for the layer families' own tests."""

from __future__ import annotations

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
