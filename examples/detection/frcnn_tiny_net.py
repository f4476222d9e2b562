#!/usr/bin/env python
"""A small Faster R-CNN end-to-end train net in py-faster-rcnn's layout (same layer names, types
and Python layers as faster_rcnn_vgg16_train.prototxt: RoIDataLayer, AnchorTargetLayer,
ProposalLayer, ProposalTargetLayer, ROIPooling, SmoothL1Loss σ 3 and 1) with a 4-conv
backbone of stride 16 and one 64-unit fc layer, for 64×64 images and 3 classes: what the CLI
test trains, and ``examples/detection/frcnn_train.py --tiny``."""

from __future__ import annotations

ANCHORS = "'feat_stride': 16 \\n'scales': !!python/tuple [1, 2, 4]"


def _conv(name, bottom, n, k=3, pad=1, std=0.1):
    return (
        f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" '
        f"convolution_param {{ num_output: {n} kernel_size: {k} pad: {pad} "
        f'weight_filler {{ type: "gaussian" std: {std} }} }} }}\n'
        f'layer {{ name: "{name}_relu" type: "ReLU" bottom: "{name}" top: "{name}" }}\n'
    )


def _pool(name, bottom):
    return (
        f'layer {{ name: "{name}" type: "Pooling" bottom: "{bottom}" top: "{name}" '
        "pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n"
    )


def net_text(lmdb) -> str:
    """py-faster-rcnn's end2end train layout with a 4-conv backbone (stride 16), 3 classes."""
    data = f"'num_classes': 4 \\n'source': '{lmdb}' \\n'scale': 64"
    body = (
        'name: "tiny_frcnn"\n'
        'layer { name: "input-data" type: "Python" top: "data" top: "im_info" top: "gt_boxes" '
        f"python_param {{ module: 'roi_data_layer.layer' layer: 'RoIDataLayer' "
        f'param_str: "{data}" }} }}\n'
    )
    bottom = "data"
    for i, n in enumerate((8, 16, 16, 32)):
        body += _conv(f"conv{i}", bottom, n, std=0.05) + _pool(f"pool{i}", f"conv{i}")
        bottom = f"pool{i}"
    body += _conv("rpn_conv", bottom, 32, std=0.05)
    body += (
        'layer { name: "rpn_cls_score" type: "Convolution" bottom: "rpn_conv" top: '
        '"rpn_cls_score" convolution_param { num_output: 18 kernel_size: 1 weight_filler { '
        'type: "gaussian" std: 0.01 } } }\n'
        'layer { name: "rpn_bbox_pred" type: "Convolution" bottom: "rpn_conv" top: '
        '"rpn_bbox_pred" convolution_param { num_output: 36 kernel_size: 1 weight_filler { '
        'type: "gaussian" std: 0.01 } } }\n'
        'layer { name: "rpn_cls_score_reshape" type: "Reshape" bottom: "rpn_cls_score" top: '
        '"rpn_cls_score_reshape" reshape_param { shape { dim: 0 dim: 2 dim: -1 dim: 0 } } }\n'
        'layer { name: "rpn-data" type: "Python" bottom: "rpn_cls_score" bottom: "gt_boxes" '
        'bottom: "im_info" bottom: "data" top: "rpn_labels" top: "rpn_bbox_targets" top: '
        '"rpn_bbox_inside_weights" top: "rpn_bbox_outside_weights" python_param { module: '
        f"'rpn.anchor_target_layer' layer: 'AnchorTargetLayer' param_str: \"{ANCHORS}\" }} }}\n"
        'layer { name: "rpn_loss_cls" type: "SoftmaxWithLoss" bottom: "rpn_cls_score_reshape" '
        'bottom: "rpn_labels" propagate_down: 1 propagate_down: 0 top: "rpn_cls_loss" '
        "loss_weight: 1 loss_param { ignore_label: -1 normalize: true } }\n"
        'layer { name: "rpn_loss_bbox" type: "SmoothL1Loss" bottom: "rpn_bbox_pred" bottom: '
        '"rpn_bbox_targets" bottom: "rpn_bbox_inside_weights" bottom: '
        '"rpn_bbox_outside_weights" top: "rpn_loss_bbox" loss_weight: 1 '
        "smooth_l1_loss_param { sigma: 3.0 } }\n"
        'layer { name: "rpn_cls_prob" type: "Softmax" bottom: "rpn_cls_score_reshape" top: '
        '"rpn_cls_prob" }\n'
        'layer { name: "rpn_cls_prob_reshape" type: "Reshape" bottom: "rpn_cls_prob" top: '
        '"rpn_cls_prob_reshape" reshape_param { shape { dim: 0 dim: 18 dim: -1 dim: 0 } } }\n'
        'layer { name: "proposal" type: "Python" bottom: "rpn_cls_prob_reshape" bottom: '
        '"rpn_bbox_pred" bottom: "im_info" top: "rpn_rois" python_param { module: '
        f"'rpn.proposal_layer' layer: 'ProposalLayer' param_str: \"{ANCHORS}\" }} }}\n"
        'layer { name: "roi-data" type: "Python" bottom: "rpn_rois" bottom: "gt_boxes" top: '
        '"rois" top: "labels" top: "bbox_targets" top: "bbox_inside_weights" top: '
        "\"bbox_outside_weights\" python_param { module: 'rpn.proposal_target_layer' "
        "layer: 'ProposalTargetLayer' param_str: \"'num_classes': 4\" } }\n"
        'layer { name: "roi_pool5" type: "ROIPooling" bottom: "pool3" bottom: "rois" top: '
        '"pool5" roi_pooling_param { pooled_w: 3 pooled_h: 3 spatial_scale: 0.0625 } }\n'
        'layer { name: "fc6" type: "InnerProduct" bottom: "pool5" top: "fc6" '
        'inner_product_param { num_output: 64 weight_filler { type: "xavier" } } }\n'
        'layer { name: "relu6" type: "ReLU" bottom: "fc6" top: "fc6" }\n'
        'layer { name: "cls_score" type: "InnerProduct" bottom: "fc6" top: "cls_score" '
        'inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.01 } } }\n'
        'layer { name: "bbox_pred" type: "InnerProduct" bottom: "fc6" top: "bbox_pred" '
        'inner_product_param { num_output: 16 weight_filler { type: "gaussian" std: 0.001 } } }\n'
        'layer { name: "loss_cls" type: "SoftmaxWithLoss" bottom: "cls_score" bottom: "labels" '
        'propagate_down: 1 propagate_down: 0 top: "loss_cls" loss_weight: 1 }\n'
        'layer { name: "loss_bbox" type: "SmoothL1Loss" bottom: "bbox_pred" bottom: '
        '"bbox_targets" bottom: "bbox_inside_weights" bottom: "bbox_outside_weights" top: '
        '"loss_bbox" loss_weight: 1 }\n'
    )
    return body
