"""BVLC Caffe's layer families, one module per family (src/caffe/layers/ grouped as Caffe's
headers group them: vision, neuron, common, loss, data, …). No fork type or form lives here:
the forks' layers and their variants of BVLC types are in :mod:`caffe2jax.lowering.forks`."""

from caffe2jax.lowering.layers import (  # noqa: F401 - each module registers its types
    common,
    data,
    loss,
    neuron,
    normalization,
    pooling,
    python,
    recurrent,
    shape,
    vision,
)
