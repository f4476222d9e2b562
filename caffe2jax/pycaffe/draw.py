"""pycaffe's ``caffe.draw``: a net as a Graphviz graph through pydot (the ``[draw]`` extra).

Layers are records (convolutions red, pooling orange, inner products purple, others blue,
in-place layers green) labelled with their name, type and geometry; blobs are grey octagons;
edges out of a layer carry its batch size (Data) or ``num_output``. ``phase`` keeps the
layers a phase includes (None: all of them), ``display_lrm`` adds the learning-rate
multipliers. Rendering (``draw_net``, ``draw_net_to_file`` with .png/.svg/.pdf…) runs
Graphviz's ``dot`` program; ``get_pydot_graph(...).to_string()`` needs only pydot.
"""

from __future__ import annotations

import os
from typing import Any

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.runtime.formats.atomic import atomic_write

LAYER_STYLE_DEFAULT = {"shape": "record", "fillcolor": "#6495ED", "style": "filled"}
NEURON_LAYER_STYLE = {"shape": "record", "fillcolor": "#90EE90", "style": "filled"}
BLOB_STYLE = {"shape": "octagon", "fillcolor": "#E0E0E0", "style": "filled"}
_COLORS = {
    "Convolution": "#FF5050",
    "Deconvolution": "#FF5050",
    "Pooling": "#FF9900",
    "InnerProduct": "#CC33FF",
}


def _pydot():
    try:
        import pydot
    except ImportError:
        raise CaffeError(
            "drawing nets needs pydot: pip install 'caffe2jax[draw]' (and Graphviz's 'dot' "
            "program to render images)"
        ) from None
    return pydot


def choose_color_by_layertype(layertype: str) -> str:
    """The fill colour of a layer node, by type."""
    return _COLORS.get(layertype, LAYER_STYLE_DEFAULT["fillcolor"])


def get_pooling_types_dict() -> dict[int, str]:
    """PoolingParameter's PoolMethod values → names (0 → "MAX" …)."""
    enum = caffe_pb2.PoolingParameter.PoolMethod
    return {value: name for name, value in enum.items()}


def _first(values: Any, default: int) -> int:
    return int(values[0]) if len(values) else default


def get_layer_lr_mult(layer: caffe_pb2.LayerParameter) -> tuple[float, float]:
    """(weight, bias) learning-rate multipliers of a Convolution/Deconvolution/InnerProduct
    layer (1 when not given; bias 0 without a bias term); (0, 0) for other types."""
    if layer.type in ("Convolution", "Deconvolution"):
        bias = layer.convolution_param.bias_term
    elif layer.type == "InnerProduct":
        bias = layer.inner_product_param.bias_term
    else:
        return 0.0, 0.0
    weight = layer.param[0].lr_mult if len(layer.param) > 0 else 1.0
    bias_mult = (layer.param[1].lr_mult if len(layer.param) > 1 else 1.0) if bias else 0.0
    return float(weight), float(bias_mult)


def get_edge_label(layer: caffe_pb2.LayerParameter) -> str | None:
    """What the edges out of a layer say: Data's batch size, a layer's num_output."""
    if layer.type == "Data":
        return f"Batch {layer.data_param.batch_size}"
    if layer.type in ("Convolution", "Deconvolution"):
        return str(layer.convolution_param.num_output)
    if layer.type == "InnerProduct":
        return str(layer.inner_product_param.num_output)
    return None


def get_layer_label(layer: caffe_pb2.LayerParameter, rankdir: str, display_lrm=False) -> str:
    """Name, (type) and geometry; one item per line, or spaced for TB/BT graphs."""
    separator = " " if rankdir in ("TB", "BT") else "\\n"
    items = [layer.name, f"({layer.type})"]
    if layer.type in ("Convolution", "Deconvolution"):
        p = layer.convolution_param
        items += [
            f"kernel size: {_first(p.kernel_size, 1)}",
            f"stride: {_first(p.stride, 1)}",
            f"pad: {_first(p.pad, 0)}",
        ]
    elif layer.type == "Pooling":
        p = layer.pooling_param
        items += [
            f"pool type: {get_pooling_types_dict()[p.pool]}",
            f"kernel size: {p.kernel_size}",
            f"stride: {p.stride}",
            f"pad: {p.pad}",
        ]
    if display_lrm:
        weight, bias = get_layer_lr_mult(layer)
        if weight or bias:
            items.append(f"lr mult: {weight:.2f}, {bias:.2f}")
    return separator.join(items)


def _included(layer: caffe_pb2.LayerParameter, phase: int | None) -> bool:
    """pycaffe's phase test: include rules name the phase, or no exclude rule does."""
    if phase is None:
        return True
    if layer.include and layer.exclude:
        raise ValueError(f"layer {layer.name} has both include and exclude specified.")
    included = not layer.include or any(rule.phase == phase for rule in layer.include)
    return included and not any(rule.phase == phase for rule in layer.exclude)


def get_pydot_graph(
    caffe_net: caffe_pb2.NetParameter,
    rankdir: str,
    label_edges: bool = True,
    phase: int | None = None,
    display_lrm: bool = False,
):
    """The net as a ``pydot.Dot`` graph (layers, blobs, and the edges between them)."""
    pydot = _pydot()
    graph = pydot.Dot(caffe_net.name or "Net", graph_type="digraph", rankdir=rankdir)
    nodes: dict[str, Any] = {}
    edges: list[tuple[str, str, str | None]] = []
    for layer in caffe_net.layer:
        if not _included(layer, phase):
            continue
        node = f"{layer.name}_{layer.type}"
        label = get_layer_label(layer, rankdir, display_lrm)
        in_place = len(layer.bottom) == len(layer.top) == 1 and layer.bottom[0] == layer.top[0]
        style = (
            NEURON_LAYER_STYLE
            if in_place
            else {**LAYER_STYLE_DEFAULT, "fillcolor": choose_color_by_layertype(layer.type)}
        )
        nodes[node] = pydot.Node(node, label=label, **style)
        for bottom in layer.bottom:
            nodes[bottom + "_blob"] = pydot.Node(bottom + "_blob", label=bottom, **BLOB_STYLE)
            edges.append((bottom + "_blob", node, None))
        for top in layer.top:
            nodes[top + "_blob"] = pydot.Node(top + "_blob", label=top, **BLOB_STYLE)
            edges.append((node, top + "_blob", get_edge_label(layer) if label_edges else None))
    for node in nodes.values():
        graph.add_node(node)
    for src, dst, label in edges:
        graph.add_edge(pydot.Edge(src, dst, **({"label": label} if label else {})))
    return graph


def draw_net(
    caffe_net: caffe_pb2.NetParameter,
    rankdir: str,
    ext: str = "png",
    phase: int | None = None,
    display_lrm: bool = False,
) -> bytes:
    """The rendered image (``ext``: png, svg, pdf, …) as bytes; needs Graphviz's ``dot``."""
    graph = get_pydot_graph(caffe_net, rankdir, phase=phase, display_lrm=display_lrm)
    try:
        return graph.create(prog="dot", format=ext)
    except FileNotFoundError:
        raise CaffeError(
            f"rendering .{ext} needs Graphviz's 'dot' program (e.g. apt-get install graphviz); "
            "write a .dot file instead"
        ) from None


def draw_net_to_file(
    caffe_net: caffe_pb2.NetParameter,
    filename: str | os.PathLike,
    rankdir: str = "LR",
    phase: int | None = None,
    display_lrm: bool = False,
    *,
    overwrite: bool = True,
) -> None:
    """Write the drawing to ``filename`` (atomically); the extension picks the format, and
    ``.dot``/``.gv`` give the Graphviz source without rendering. ``overwrite=False`` refuses
    an existing file."""
    name = os.fspath(filename)
    ext = name[name.rfind(".") + 1 :].lower() if "." in os.path.basename(name) else ""
    if ext in ("dot", "gv"):
        graph = get_pydot_graph(caffe_net, rankdir, phase=phase, display_lrm=display_lrm)
        atomic_write(name, graph.to_string(), overwrite=overwrite)
    elif ext:
        image = draw_net(caffe_net, rankdir, ext, phase, display_lrm)
        atomic_write(name, image, overwrite=overwrite)
    else:
        raise CaffeError(f"{name}: no extension to pick the format (.png, .svg, .pdf, .dot)")
