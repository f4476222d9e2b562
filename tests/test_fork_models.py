"""The forks' development set (../shared/forks/models) run as a user runs it (issue 22).

- every deploy prototxt compiles and runs a TEST forward with random weights (batch 1, the
  prototxt's own input shape), every output finite;
- where OpenCV dnn runs the same net (``cv2.dnn.readNetFromCaffe`` reading the .caffemodel
  caffe2jax writes, so the weights round-trip through our writer too), the outputs agree
  within 1e-4 relative to each output's largest magnitude (the issue's bar);
- every train/test prototxt parses, upgrades and ``summary`` lists it (tests/cli/test_summary).

The set of nets OpenCV must run is written out (OPENCV_RUNS): a net OpenCV stops running, or
that we stop agreeing on, fails here rather than quietly leaving the comparison.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests import fork_runs

pytestmark = pytest.mark.slow

#: Deploy nets OpenCV 4.14 runs. It lacks BN, Upsample, DepthwiseConvolution and the YOLO
#: outputs; it runs py-faster-rcnn's proposal only rewritten to its own Proposal type; its
#: Axpy takes the bottoms the other way round (fork_runs.opencv_text swaps them back).
OPENCV_RUNS = {
    "densenet201_shicai.prototxt",
    "resnext101_32x4d_soeaver.prototxt",
    "se_resnet101.prototxt",
    "se_resnext50.prototxt",
}

RELATIVE = 1e-4


@pytest.mark.parametrize("name", fork_runs.deploy_names())
def test_deploy_model_runs_and_agrees_with_opencv(name, tmp_path):
    model = fork_runs.compile_model(name)
    params, state = fork_runs.random_weights(model)
    inputs = fork_runs.random_inputs(model)
    ours = fork_runs.run_ours(model, params, state, inputs)
    for blob, value in ours.items():
        assert np.isfinite(value).all(), (name, blob)
    if name not in OPENCV_RUNS:
        return
    theirs = fork_runs.run_opencv(name, model, params, state, inputs, tmp_path)
    assert fork_runs.max_relative(ours, theirs) <= RELATIVE


def test_the_deploy_set_is_the_seventeen_nets_with_inputs():
    names = fork_runs.deploy_names()
    assert len(names) == 17
    assert OPENCV_RUNS <= set(names)


@pytest.mark.parametrize(
    "name",
    [
        "ssd_mobilenetv2_ssdlite_deploy.prototxt",
        "enet_deploy_bn.prototxt",
        "shufflenet_v2_2x.prototxt",
    ],  # fmt: skip
)
def test_pycaffe_net_forward_on_a_detector_a_segmenter_and_a_classifier(name, tmp_path):
    """pycaffe's flow on fork nets: Net(prototxt, weights, TEST), fill data, forward."""
    import caffe2jax as caffe

    model = fork_runs.compile_model(name)
    params, state = fork_runs.random_weights(model)
    weights = caffe.save_weights(tmp_path / "w.caffemodel", model, params, state)
    net = caffe.Net(str(fork_runs.FORK_MODELS / name), str(weights), caffe.TEST)
    data = fork_runs.random_inputs(model)
    for blob, value in data.items():
        net.blobs[blob].data[...] = value
    out = net.forward()
    ours = fork_runs.run_ours(model, params, state, data)
    for key, value in out.items():
        assert np.isfinite(value).all(), key
        if key in ours:
            np.testing.assert_allclose(value, ours[key], rtol=1e-5, atol=1e-6)
