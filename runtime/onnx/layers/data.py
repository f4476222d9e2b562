"""Data layers in ONNX: their tops are the graph's inputs (named as the blobs, shaped as
compiled); DummyData's constant tops are constants.

The data layers' transformations (``transform_param``: scale, mean, crop, mirror) are applied
by caffe2jax's data pipeline before the net, never inside it, so they are not in the graph
either: feed the exported model what the net's first layer reads (docs/onnx.md).
"""

from __future__ import annotations

import numpy as np

from caffe2jax.frontend.forks.forms import FORMS
from caffe2jax.lowering.registry import DATA_LAYERS
from caffe2jax.runtime.onnx.registry import register
from caffe2jax.runtime.onnx.site import Site


def source(site: Site) -> list[str]:
    """A data layer: each top is a graph input (declared by the graph walk)."""
    return list(site.tops)


for _type, _kind in DATA_LAYERS.items():
    if _kind.feed != "sink":
        register(_type, form=FORMS.get(_type, ("",)))(source)


@register("DummyData")
def dummy_data(site: Site) -> list[str]:
    """DummyDataLayer with constant fillers (random ones are refused: their values would
    change on every forward)."""
    p = site.param.dummy_data_param
    fillers = list(p.data_filler)
    tops = []
    for i, shape in enumerate(site.top_shapes):
        filler = fillers[i if len(fillers) > 1 else 0] if fillers else None
        if filler is not None and filler.type != "constant":
            site.refuse(f"filler '{filler.type}' draws new random numbers on every forward; "
                        "only constant DummyData has an ONNX form")  # fmt: skip
        if site.top_batch[i] is not None:
            site.refuse("a DummyData top does not follow the inputs' batch size")
        value = filler.value if filler is not None else 0.0
        tops.append(site.g.const(np.full(shape, value, np.float32), hint="dummy"))
    return tops
