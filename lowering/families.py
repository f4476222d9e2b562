"""Imports every layer family so its registrations run (one module per family)."""

from caffe2jax.lowering import (  # noqa: F401
    common,
    data,
    loss,
    memory_loss,
    neuron,
    normalization,
    pooling,
    python_layer,
    recurrent,
    shape,
    vision,
    vision3d,
)
