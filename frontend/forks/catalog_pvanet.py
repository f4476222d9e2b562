"""PVANet's Caffe as data (issue 35): sanghoon/caffe@6068dd0 (branch dev_pvanet, the submodule
of sanghoon/pva-faster-rcnn), rbgirshick's Faster R-CNN fields plus the C++ ``Proposal``
layer's ``proposal_param`` under the fork's own numbers. Its layer:
:mod:`caffe2jax.lowering.forks.pvanet`; docs/forks.md.
"""

from __future__ import annotations

from caffe2jax.frontend.forks.fork import Fork

PVANET_FORKS = (
    Fork("pvanet", "PVANet", "sanghoon/caffe@6068dd0 (dev_pvanet)",
         adds={"LayerParameter": {"roi_pooling_param": 8266711, "smooth_l1_loss_param": 8266712,
                                  "proposal_param": 8266713}},
         types=("ROIPooling", "SmoothL1Loss", "Proposal")),
)  # fmt: skip
