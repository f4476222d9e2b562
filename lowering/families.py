"""Imports every layer family so its registrations run (one module per family)."""

from caffe2jax.lowering import (  # noqa: F401
    fork_loss,
    fork_neuron,
    python_layer,
    smooth_l1,
)
from caffe2jax.lowering.forks import (  # noqa: F401
    c3d,
    crnn,
    deeplab,
    mobile,
    mycaffe,
    rcnn_proposal,
    rcnn_roi,
    rcnn_targets,
    rfcn,
    rfcn_ohem,
    segnet,
    ssd,
    ssd_detection_evaluate,
    ssd_detection_output,
    ssd_multibox_loss,
    yolo,
)
from caffe2jax.lowering.layers import (  # noqa: F401
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
