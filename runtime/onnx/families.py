"""Imports every converter family so its registrations run (one module per family)."""

from caffe2jax.runtime.onnx.forks import (  # noqa: F401
    c3d,
    detection_output,
    mobile,
    rcnn,
    rfcn,
    segmentation,
    ssd,
    yolo,
)
from caffe2jax.runtime.onnx.layers import (  # noqa: F401
    common,
    data,
    loss,
    neuron,
    normalization,
    pooling,
    recurrent,
    shape,
    vision,
)
