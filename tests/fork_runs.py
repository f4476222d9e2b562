"""Running the forks' development set as a user would: each deploy prototxt compiled, given
random weights, run on a random batch, and (where OpenCV dnn has every layer) run again by
``cv2.dnn.readNetFromCaffe`` from the .caffemodel caffe2jax writes, the outputs compared.

Deploy prototxts rarely name fillers (their weights come from a .caffemodel), so
:func:`random_weights` draws every blob itself: fan-in scaled weights (activations keep their
size through 100 layers), BatchNorm variances in [0.5, 1.5] with scale factor 1, Scale and
other blobs near one. Shared by ``tests/test_fork_models.py`` and ``scripts/fork_table.py``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np

from caffe2jax.frontend.pipeline import load_net
from caffe2jax.lowering.model import Model
from caffe2jax.runtime.formats.weights import save_weights
from tests.forks import DEFINES, FORK_MODELS, manifest

#: Layer types whose blobs are (weights, bias): weights drawn with fan-in scaling.
WEIGHTED = {"Convolution", "Deconvolution", "InnerProduct", "ConvolutionDepthwise",
            "DepthwiseConvolution", "Convolution3D"}  # fmt: skip
#: Data layer types a deploy net may hold (an Input is fed, nothing else is read).
DEPLOY_DATA = {"Input"}


def deploy_names() -> list[str]:
    """The development set's deploy prototxts: those whose only data layer is an Input (or
    ``input:`` fields), so a forward needs nothing but the batch."""
    names = []
    for entry in manifest():
        types = set(entry["layer_types"])
        if not any(t.endswith("Data") or t.endswith("DATA") for t in types):
            if not any(t.startswith("Python:roi_data_layer") for t in types):
                names.append(entry["name"])
    return sorted(names)


def compile_model(name: str, input_shapes: dict | None = None) -> Model:
    """The model of development-set prototxt ``name`` in TEST phase (dialect from its text)."""
    path = FORK_MODELS / name
    return Model(load_net(path, "TEST", defines=DEFINES), input_shapes)


def random_weights(model: Model, seed: int = 0) -> tuple[dict, Any]:
    """Every param and state blob ``model`` owns drawn at random (see the module docstring),
    in the structure ``model.init`` gives (shared slots and recurrent carries kept)."""
    rng = np.random.default_rng(seed)
    types = {layer.name: layer.type for layer in model.net.layers}
    params, state = model.init(0)
    heads = _yolo_heads(model)
    for key, j, decl in model.graph.owned():
        tree = state if decl.state else params
        tree[key][j] = _draw(rng, types.get(key, ""), j, tuple(decl.shape))
        if key in heads:
            tree[key][j] *= 0.01
    return params, state


def _yolo_heads(model: Model) -> set[str]:
    """The layers writing what a YOLO output decodes. A trained head keeps its box terms
    small (the box size is their exp); random weights give terms near 100, whose exp
    overflows float32 in the fork as here, so these layers' weights are drawn 100× smaller."""
    writer = {ssa: layer for layer in model.net.layers for ssa in layer.tops}
    todo = [b for layer in model.net.layers if layer.type.startswith("Yolo") for b in layer.bottoms]
    heads: set[str] = set()
    while todo:  # back through layers without blobs (Concat, Reshape…) to the convolutions
        layer = writer.get(todo.pop())
        if layer is None or layer.name in heads:
            continue
        heads.add(layer.name)
        if not model.graph.decls.get(layer.name):
            todo.extend(layer.bottoms)
    return heads


def _draw(rng: np.random.Generator, kind: str, j: int, shape: tuple[int, ...]) -> np.ndarray:
    if kind in WEIGHTED and j == 0:
        fan_in = (
            math.prod(shape[1:]) if kind != "Deconvolution" else shape[0] * math.prod(shape[2:])
        )
        return (rng.standard_normal(shape) * math.sqrt(1.0 / max(fan_in, 1))).astype(np.float32)
    if kind == "BatchNorm":
        fills = (lambda: rng.normal(0, 0.1, shape), lambda: rng.uniform(0.5, 1.5, shape),
                 lambda: np.ones(shape))  # fmt: skip
        return fills[min(j, 2)]().astype(np.float32)
    if kind in WEIGHTED:
        return rng.normal(0, 0.1, shape).astype(np.float32)
    return rng.uniform(0.5, 1.5, shape).astype(np.float32)


def random_inputs(model: Model, seed: int = 1) -> dict[str, np.ndarray]:
    """A batch for every input: images in [0, 1); ``im_info`` (Faster R-CNN, R-FCN) as
    py-faster-rcnn feeds it: height, width, scale 1."""
    rng = np.random.default_rng(seed)
    inputs = {}
    image = next(shape for shape in model.inputs.values() if len(shape) == 4)
    for name, shape in model.inputs.items():
        if name == "im_info":
            inputs[name] = np.array([[image[2], image[3], 1.0]], np.float32).reshape(shape)
        else:
            inputs[name] = rng.uniform(0, 1, shape).astype(np.float32)
    return inputs


def compared(model: Model) -> dict[str, str]:
    """The blobs compared, by SSA id, each with the layer that writes it (OpenCV's output
    name): the net's outputs and, for an output made by a Softmax, its bottom too (a softmax
    saturated by random weights would hide a difference in the scores)."""
    writer = {ssa: layer for layer in model.net.layers for ssa in layer.tops}
    picked = {}
    for user in model.net.outputs:
        layer = writer[model.net.blob_names[user]]
        picked[model.net.blob_names[user]] = layer.name
        if layer.type == "Softmax":
            picked[layer.bottoms[0]] = writer[layer.bottoms[0]].name
    return picked


def run_ours(model: Model, params, state, inputs) -> dict[str, np.ndarray]:
    """The compared blobs (:func:`compared`) after one TEST forward, by OpenCV layer name."""
    picked = compared(model)

    @jax.jit
    def forward(params, state, inputs):  # only the compared blobs live past the program
        blobs = model.apply(params, state, inputs)[0]
        return {name: blobs[ssa] for ssa, name in picked.items()}

    return {name: np.asarray(v) for name, v in forward(params, state, inputs).items()}


def run_opencv(name: str, model, params, state, inputs, folder: Path) -> dict[str, np.ndarray]:
    """The same blobs from OpenCV dnn, reading the .caffemodel caffe2jax writes."""
    import cv2

    weights = save_weights(folder / f"{Path(name).stem}.caffemodel", model, params, state)
    text = folder / name
    text.write_text(opencv_text((FORK_MODELS / name).read_text()))
    net = cv2.dnn.readNetFromCaffe(str(text), str(weights))
    for blob, value in inputs.items():
        net.setInput(value, blob)
    names = list(compared(model).values())
    return dict(zip(names, (np.asarray(x) for x in net.forward(names)), strict=True))


def opencv_text(text: str) -> str:
    """The prototxt as OpenCV must read it to compute what the fork computes. OpenCV 4.x's
    importer builds Axpy as ``a * bottom[2] + bottom[1]``; SENet's AxpyLayer computes
    ``a * bottom[1] + bottom[2]`` (axpy_layer.hpp: F = a * X + Y, X = bottom[1]), so OpenCV is
    handed the two bottoms swapped."""
    pattern = re.compile(
        r'(type:\s*"Axpy"\s*bottom:\s*"[^"]*"\s*)bottom:\s*"([^"]*)"(\s*)bottom:\s*"([^"]*)"'
    )
    return pattern.sub(r'\1bottom: "\4"\3bottom: "\2"', text)


def max_relative(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> float:
    """The largest |ours - theirs| over all outputs, each relative to its largest magnitude."""
    worst = 0.0
    for key, mine in ours.items():
        other = theirs[key].reshape(mine.shape)
        scale = max(float(np.max(np.abs(mine))), 1e-30)
        worst = max(worst, float(np.max(np.abs(mine - other))) / scale)
    return worst
