"""A small SSD on SSD's AnnotatedData recipe (mirror, emit CENTER, distort, expand, samplers,
resize with interpolation modes), 48×48: two stride-2 convolutions, one PriorBox layer,
MultiBoxLoss, and a test net ending in DetectionOutput + DetectionEvaluate. Prototxt pieces
for ``train_ssd_synthetic.py --small`` and the CI test of ``caffe2jax train`` on
AnnotatedData (tests/cli/test_train_annotated.py); ``DATA`` is a format string (phase,
transform, size, interp, source, batch, samplers, labelmap)."""

SIZE = 48
DATA = """layer {{ name: "data" type: "AnnotatedData" top: "data" top: "label"
  include {{ phase: {phase} }}
  transform_param {{ {transform} mean_value: 127.5 mean_value: 127.5 mean_value: 127.5
    scale: 0.007843 resize_param {{ resize_mode: WARP height: {size} width: {size}
    interp_mode: LINEAR {interp} }} }}
  data_param {{ source: "{source}" batch_size: {batch} backend: LMDB }}
  annotated_data_param {{ {samplers} label_map_file: "{labelmap}" }} }}
"""
TRAIN_AUG = ("mirror: true emit_constraint { emit_type: CENTER } distort_param { "
             "brightness_prob: 0.5 brightness_delta: 32 hue_prob: 0.5 hue_delta: 18 } "
             "expand_param { prob: 0.5 max_expand_ratio: 2 }")  # fmt: skip
SAMPLERS = ("batch_sampler { max_sample: 1 max_trials: 1 } batch_sampler { sampler { "
            "min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 max_aspect_ratio: 2 } "
            "sample_constraint { min_jaccard_overlap: 0.3 } max_sample: 1 "
            "max_trials: 20 }")  # fmt: skip
BODY = """
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param {
  num_output: 16 kernel_size: 3 stride: 2 pad: 1 weight_filler { type: "msra" } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2" convolution_param {
  num_output: 16 kernel_size: 3 stride: 2 pad: 1 weight_filler { type: "msra" } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "loc" type: "Convolution" bottom: "conv2" top: "loc" convolution_param {
  num_output: 12 kernel_size: 3 pad: 1 weight_filler { type: "msra" } } }
layer { name: "loc_perm" type: "Permute" bottom: "loc" top: "loc_perm"
  permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "mbox_loc" type: "Flatten" bottom: "loc_perm" top: "mbox_loc" }
layer { name: "conf" type: "Convolution" bottom: "conv2" top: "conf" convolution_param {
  num_output: 12 kernel_size: 3 pad: 1 weight_filler { type: "msra" } } }
layer { name: "conf_perm" type: "Permute" bottom: "conf" top: "conf_perm"
  permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "mbox_conf" type: "Flatten" bottom: "conf_perm" top: "mbox_conf" }
layer { name: "mbox_priorbox" type: "PriorBox" bottom: "conv2" bottom: "data"
  top: "mbox_priorbox" prior_box_param { min_size: 14 max_size: 30 aspect_ratio: 2 flip: false
  clip: false variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 } }
"""
LOSS = """layer { name: "mbox_loss" type: "MultiBoxLoss" bottom: "mbox_loc" bottom: "mbox_conf"
  bottom: "mbox_priorbox" bottom: "label" top: "mbox_loss" propagate_down: true
  propagate_down: true propagate_down: false propagate_down: false
  multibox_loss_param { num_classes: 4 overlap_threshold: 0.5 neg_pos_ratio: 3 neg_overlap: 0.5
  code_type: CENTER_SIZE } }
"""
EVAL = """layer { name: "conf_reshape" type: "Reshape" bottom: "mbox_conf" top: "conf_reshape"
  reshape_param { shape { dim: 0 dim: -1 dim: 4 } } }
layer { name: "conf_softmax" type: "Softmax" bottom: "conf_reshape" top: "conf_softmax"
  softmax_param { axis: 2 } }
layer { name: "conf_flat" type: "Flatten" bottom: "conf_softmax" top: "conf_flat" }
layer { name: "detection_out" type: "DetectionOutput" bottom: "mbox_loc" bottom: "conf_flat"
  bottom: "mbox_priorbox" top: "detection_out" detection_output_param { num_classes: 4
  nms_param { nms_threshold: 0.45 top_k: 100 } code_type: CENTER_SIZE keep_top_k: 50
  confidence_threshold: 0.01 } }
layer { name: "detection_eval" type: "DetectionEvaluate" bottom: "detection_out" bottom: "label"
  top: "detection_eval" detection_evaluate_param { num_classes: 4 overlap_threshold: 0.5 } }
"""
