"""The forks' layers, one module per fork family, named by fork. A fork's variant of a BVLC
type is registered under a key that carries its form (``register("Dropout",
form="scale_train")``); the BVLC body in :mod:`caffe2jax.lowering.layers` never reads it."""

from caffe2jax.lowering.forks import (  # noqa: F401 - each module registers its types
    c3d,
    crnn,
    deeplab,
    enet,
    face,
    face_layers,
    fpn,
    mobile,
    mycaffe,
    rcf,
    rcnn,
    rcnn_proposal,
    rcnn_roi,
    rcnn_targets,
    rfcn,
    rfcn_ohem,
    segnet,
    selu,
    ssd,
    ssd_detection_evaluate,
    ssd_detection_output,
    ssd_multibox_loss,
    yolo,
)
