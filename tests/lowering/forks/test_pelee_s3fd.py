"""Pelee (Robert-JunWang/Pelee@96979b3, model/voc/deploy_merged.prototxt) and S3FD (sfzhang15/SFD@
c1abcf0: its deploy net is distributed outside the repository; its form read from the paper and
bonseyes/SFD's VGG deploy, 72a8a77) on weiliu89's SSD layers, in minimal nets of their form
written here (the fork prototxts were used in development, never committed: Pelee's whole
deploy net compiles and runs forward in caffe2jax).

* Pelee's PriorBox has fractional sizes (min_size 21.28, max_size 45.6 …): SSD's fork stores
  them in ints (21, 45), which caffe2jax follows bit for bit; OpenCV dnn keeps the fractions,
  so there OpenCV is not the oracle — the fork's own loop (test_ssd.py ``fork_prior_box``) is.
* S3FD: Normalize per level (across_spatial false, channel_shared false, scales 10 / 8 / 5),
  PriorBox with min_size 16 / 32, step 4 / 8, offset 0.5 and no aspect ratio, and the max-out
  background label of its first level (conf with 3 background scores and the face score: Slice,
  Eltwise MAX over the 3 background maps, Concat with the face map): against OpenCV dnn with
  the same weights."""

from __future__ import annotations

import numpy as np

from tests.lowering.fork_nets import max_rel, net, opencv, ours
from tests.lowering.forks.test_ssd import fork_prior_box

PELEE_PRIOR = ("prior_box_param { min_size: 21.2800006866 max_size: 45.5999984741 "
               "aspect_ratio: 2.0 aspect_ratio: 3.0 flip: true clip: false variance: 0.1 "
               "variance: 0.1 variance: 0.2 variance: 0.2 }")  # fmt: skip


def _pelee_net() -> str:
    layer = ('layer { name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" '
             f"{PELEE_PRIOR} }}")  # fmt: skip
    return net(layer, {"data": (1, 3, 304, 304), "feat": (1, 4, 19, 19)})


def test_pelee_fractional_prior_sizes_follow_the_ssd_forks_int_sizes():
    inputs = {"data": np.zeros((1, 3, 304, 304)), "feat": np.zeros((1, 4, 19, 19))}
    pb = ours(_pelee_net(), inputs)["pb"][0, 0]
    want = fork_prior_box(19, 19, 304, 304, [21.28], [45.6], [2.0, 3.0], flip=True)
    np.testing.assert_array_equal(pb.view(np.uint32), want.view(np.uint32))
    # the first prior of the first cell spans the fork's int 21, not 21.28
    assert round(float(pb[2] - pb[0]) * 304, 4) == 21.0
    cv = opencv(_pelee_net(), inputs, ["pb"])["pb"][0].reshape(2, -1)[0]
    assert round(float(cv[2] - cv[0]) * 304, 2) == 21.28  # OpenCV keeps the fraction
    assert not np.allclose(cv, pb, atol=1e-4)


def _level(name: str, bottom: str, scale: float, conf: int, min_size: int, step: int) -> str:
    return (
        f'layer {{ name: "{name}_norm" type: "Normalize" bottom: "{bottom}" '
        f'top: "{name}_norm" norm_param {{ across_spatial: false channel_shared: false '
        f'scale_filler {{ type: "constant" value: {scale} }} }} }}\n'
        f'layer {{ name: "{name}_loc" type: "Convolution" bottom: "{name}_norm" '
        f'top: "{name}_loc" convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 }} }}\n'
        f'layer {{ name: "{name}_conf" type: "Convolution" bottom: "{name}_norm" '
        f'top: "{name}_conf" convolution_param {{ num_output: {conf} kernel_size: 3 pad: 1 }} }}\n'
        f'layer {{ name: "{name}_pb" type: "PriorBox" bottom: "{name}_norm" bottom: "data" '
        f'top: "{name}_pb" prior_box_param {{ min_size: {min_size} clip: false variance: 0.1 '
        f"variance: 0.1 variance: 0.2 variance: 0.2 step: {step} offset: 0.5 }} }}\n"
    )


MAXOUT = (
    'layer { name: "slice" type: "Slice" bottom: "l1_conf" top: "bg1" top: "bg2" top: "bg3" '
    'top: "face" slice_param { axis: 1 slice_point: 1 slice_point: 2 slice_point: 3 } }\n'
    'layer { name: "bg" type: "Eltwise" bottom: "bg1" bottom: "bg2" bottom: "bg3" top: "bg" '
    "eltwise_param { operation: MAX } }\n"
    'layer { name: "maxout" type: "Concat" bottom: "bg" bottom: "face" top: "maxout" '
    "concat_param { axis: 1 } }\n"
)


def test_s3fd_form_matches_opencv():
    text = net(
        'layer { name: "c1" type: "Convolution" bottom: "data" top: "c1" '
        "convolution_param { num_output: 6 kernel_size: 3 stride: 4 pad: 1 } }\n"
        'layer { name: "c2" type: "Convolution" bottom: "c1" top: "c2" '
        "convolution_param { num_output: 6 kernel_size: 3 stride: 2 pad: 1 } }\n"
        + _level("l1", "c1", 10.0, 4, 16, 4) + _level("l2", "c2", 8.0, 2, 32, 8) + MAXOUT,
        {"data": (1, 3, 32, 32)},
    )  # fmt: skip
    rng = np.random.default_rng(2)
    weights = {}
    for name, cin, cout in (("c1", 3, 6), ("c2", 6, 6), ("l1_loc", 6, 4), ("l1_conf", 6, 4),
                            ("l2_loc", 6, 4), ("l2_conf", 6, 2)):  # fmt: skip
        weights[name] = [rng.normal(0, 0.3, (cout, cin, 3, 3)), rng.normal(0, 0.1, cout)]
    weights["l1_norm"] = [np.full(6, 10.0) + rng.normal(0, 0.5, 6)]
    weights["l2_norm"] = [np.full(6, 8.0) + rng.normal(0, 0.5, 6)]
    x = {"data": rng.normal(size=(1, 3, 32, 32))}
    mine = ours(text, x, weights)
    tops = ["l1_norm", "l2_norm", "l1_loc", "l2_conf", "maxout", "l1_pb", "l2_pb"]
    theirs = opencv(text, x, tops, weights)
    for top in tops:
        assert max_rel(mine[top], theirs[top][0].reshape(mine[top].shape)) < 1e-5, top
    bg = np.max(mine["l1_conf"][:, :3], axis=1)
    np.testing.assert_array_equal(mine["maxout"][:, 0], bg)
    np.testing.assert_array_equal(mine["maxout"][:, 1], mine["l1_conf"][:, 3])
