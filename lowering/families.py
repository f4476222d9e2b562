"""Imports every layer family so its registrations run (one module per family)."""

from caffe2jax.lowering import (  # noqa: F401
    common,
    data,
    detection,
    detection_output,
    loss,
    memory_loss,
    neuron,
    normalization,
    pooling,
    proposal,
    python_layer,
    recurrent,
    roi,
    shape,
    vision,
    vision3d,
    yolo,
)
