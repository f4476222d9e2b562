"""Imports every layer family so its registrations run (one module per family)."""

from caffe2jax.lowering import (  # noqa: F401
    common,
    data,
    fork_bn,
    fork_channels,
    fork_neuron,
    fork_resample,
    loss,
    memory_loss,
    neuron,
    normalization,
    pooling,
    python_layer,
    recurrent,
    shape,
    vision,
)
