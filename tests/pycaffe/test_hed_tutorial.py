"""HED's tutorial (s9xie/hed, examples/hed/HED-tutorial.ipynb) run as the notebook runs it,
through ``import caffe`` (caffe2jax.install_as_caffe()): ``caffe.Net(deploy, weights,
caffe.TEST)``, ``net.blobs['data'].reshape(1, *in_.shape)``, ``forward()``, the five side
outputs ``sigmoid-dsn1..5`` and ``sigmoid-fuse`` read from ``net.blobs``.

HED's deploy.prototxt crops each upsampled side output back to the image with a bare two-bottom
``Crop`` (HED's Caffe has no ``crop_param``; its CropLayer::LayerSetUp finds the offset from the
coordinate maps, frontend/forks/coord_maps.py). The net here is HED's deploy net with its
kernels, pads and strides (conv1_1 pad 35, four 2×2 pools, deconvolutions k 2^(s), stride
2^(s-1)) and 3 channels a convolution instead of VGG's 64…512. The oracle: OpenCV dnn runs the
same weights up to the deconvolutions (``score-dsn*-up``); the crop is taken in NumPy at HED's
offsets worked by hand (34 + 2^(s-2) for stage s ≥ 2, 34 for stage 1 — the values HED's
reimplementations hard-code: 34, 35, 36, 38, 42), then the sigmoid and the fuse in float64.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

import caffe2jax

caffe2jax.install_as_caffe()
import caffe  # noqa: E402 - the notebook's own import, through the alias

OFFSETS = {1: 34, 2: 35, 3: 36, 4: 38, 5: 42}
WIDTH = 3  # channels per convolution (VGG's 64…512 shrunk)


def _conv(name: str, bottom: str, pad: int = 1) -> str:
    return (
        f"layer {{ bottom: '{bottom}' top: '{name}' name: '{name}' type: \"Convolution\"\n"
        f"  convolution_param {{ num_output: {WIDTH} pad: {pad} kernel_size: 3 }} }}\n"
        f"layer {{ bottom: '{name}' top: '{name}' name: 'relu{name[4:]}' type: \"ReLU\" }}\n"
    )


def _side(stage: int, bottom: str) -> str:
    """score-dsnS (1×1), its deconvolution (stage ≥ 2), the bare Crop to data, a Sigmoid."""
    text = (
        f"layer {{ name: 'score-dsn{stage}' type: \"Convolution\" bottom: '{bottom}' "
        f"top: 'score-dsn{stage}' convolution_param {{ num_output: 1 kernel_size: 1 }} }}\n"
    )
    up = f"score-dsn{stage}"
    if stage > 1:
        k, s = 2**stage, 2 ** (stage - 1)
        text += (
            f"layer {{ type: \"Deconvolution\" name: 'upsample_{s}' bottom: '{up}' "
            f"top: '{up}-up' convolution_param {{ kernel_size: {k} stride: {s} "
            "num_output: 1 } }\n"
        )
        up += "-up"
    return text + (
        f"layer {{ type: \"Crop\" name: 'crop' bottom: '{up}' bottom: 'data' "
        f"top: 'upscore-dsn{stage}' }}\n"
        f'layer {{ type: "Sigmoid" name: "sigmoid-dsn{stage}" bottom: "upscore-dsn{stage}" '
        f'top: "sigmoid-dsn{stage}" }}\n'
    )


def hed_deploy() -> str:
    """HED's deploy.prototxt's layers, names and geometry (the widths and the 500×500 input
    shrunk)."""
    text = 'name: "HED"\ninput: "data"\ninput_dim: 1\ninput_dim: 3\ninput_dim: 40\ninput_dim: 40\n'
    bottom = "data"
    for stage, convs in enumerate((2, 2, 3, 3, 3), start=1):
        if stage > 1:
            text += (
                f"layer {{ name: 'pool{stage - 1}' bottom: '{bottom}' top: 'pool{stage - 1}' "
                'type: "Pooling" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n'
            )
            bottom = f"pool{stage - 1}"
        for i in range(1, convs + 1):
            name = f"conv{stage}_{i}"
            text += _conv(name, bottom, pad=35 if name == "conv1_1" else 1)
            bottom = name
        text += _side(stage, bottom)
    concat = " ".join(f'bottom: "upscore-dsn{s}"' for s in range(1, 6))
    return text + (
        f'layer {{ name: "concat" {concat} top: "concat-upscore" type: "Concat" '
        "concat_param { concat_dim: 1 } }\n"
        "layer { name: 'new-score-weighting' type: \"Convolution\" bottom: 'concat-upscore' "
        "top: 'upscore-fuse' convolution_param { num_output: 1 kernel_size: 1 } }\n"
        'layer { type: "Sigmoid" name: "sigmoid-fuse" bottom: "upscore-fuse" '
        'top: "sigmoid-fuse" }\n'
    )


@pytest.fixture(scope="module")
def hed(tmp_path_factory):
    """(deploy path, weights path): random weights of the shrunk HED net, saved by caffe.Net."""
    folder = tmp_path_factory.mktemp("hed")
    deploy = folder / "deploy.prototxt"
    deploy.write_text(hed_deploy())
    net = caffe.Net(str(deploy), caffe.TEST)
    rng = np.random.default_rng(0)
    for name in net.params:
        for blob in net.params[name]:
            blob.data[...] = rng.normal(0, 0.4, blob.data.shape)
    weights = folder / "hed.caffemodel"
    net.save(str(weights))
    return deploy, weights


def _sigmoid(x):
    return 1 / (1 + np.exp(-np.asarray(x, np.float64)))


def test_tutorial_side_outputs_and_fuse_match_opencv_cropped_at_heds_offsets(hed):
    deploy, weights = hed
    rng = np.random.default_rng(1)
    in_ = rng.uniform(-2, 2, (37, 45, 3)).astype(np.float32).transpose((2, 0, 1))
    net = caffe.Net(str(deploy), str(weights), caffe.TEST)  # the notebook's calls from here
    net.blobs["data"].reshape(1, *in_.shape)
    net.blobs["data"].data[...] = in_
    net.forward()
    outs = [net.blobs[f"sigmoid-dsn{s}"].data[0][0, :, :] for s in range(1, 6)]
    fuse = net.blobs["sigmoid-fuse"].data[0][0, :, :]

    cv = cv2.dnn.readNetFromCaffe(str(deploy), str(weights))
    cv.enableWinograd(False)  # its fast 3×3 convolutions round differently
    cv.setInput(in_[None])
    names = ["score-dsn1"] + [f"upsample_{2 ** (s - 1)}" for s in range(2, 6)]  # layer names
    ups = cv.forward(names)
    side = []
    for stage, up in enumerate(ups, start=1):
        o = OFFSETS[stage]
        side.append(np.asarray(up, np.float64)[0, 0, o : o + 37, o : o + 45])
        # float32 sums in OpenCV's order and ours across up to 13 convolutions: logits agree
        # to 1e-5 of their scale (a crop one pixel off differs by the logits' own scale)
        scale = np.abs(side[-1]).max()
        logits = net.blobs[f"upscore-dsn{stage}"].data[0, 0]
        np.testing.assert_allclose(logits, side[-1], rtol=0, atol=1e-5 * scale)
        tol = 0.25e-5 * scale + 1e-6  # the logits' through the sigmoid (slope ≤ 1/4)
        np.testing.assert_allclose(outs[stage - 1], _sigmoid(side[-1]), rtol=0, atol=tol)
        assert 0.05 < np.median(outs[stage - 1]) < 0.95  # not saturated
    w, b = (np.asarray(p.data, np.float64) for p in net.params["new-score-weighting"])
    want = _sigmoid(np.tensordot(w[0, :, 0, 0], np.stack(side), axes=1) + b[0])
    np.testing.assert_allclose(fuse, want, rtol=0, atol=5e-5)  # five sides' rounding summed


def test_the_crops_take_heds_offsets_and_bvlc_keeps_zero(hed, caplog):
    deploy, _ = hed
    for dialect, want in ((None, OFFSETS), ("bvlc", None)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="caffe2jax"):
            model = caffe2jax.compile(str(deploy), phase="TEST", dialect=dialect)
        crops = [lay for lay in model.net.layers if lay.type == "Crop"]
        got = [list(lay.param.crop_param.offset) for lay in crops]
        assert got == ([[o, o] for o in want.values()] if want else [[]] * 5)
        said = [r.getMessage() for r in caplog.records if "HED's Crop" in r.getMessage()]
        assert len(said) == (5 if want else 0), said  # BVLC's 0 differs: the user is told


def test_a_bare_crop_the_maps_cannot_align_stays_bvlcs(tmp_path):
    """An InnerProduct has no coordinate map in HED's Caffe (it would refuse the net): BVLC's
    offset 0 stands, and a bare Crop whose bottoms align at 0 is unchanged."""
    text = (
        'input: "data" input_shape { dim: 1 dim: 1 dim: 6 dim: 6 }\n'
        'input: "ref" input_shape { dim: 1 dim: 1 dim: 4 dim: 4 }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
        "inner_product_param { num_output: 16 } }\n"
        'layer { name: "r" type: "Reshape" bottom: "ip" top: "r" '
        "reshape_param { shape { dim: 1 dim: 1 dim: 4 dim: 4 } } }\n"
        'layer { name: "c1" type: "Crop" bottom: "data" bottom: "ref" top: "c1" }\n'
        'layer { name: "pad" type: "Convolution" bottom: "data" top: "p" '
        "convolution_param { num_output: 1 kernel_size: 1 } }\n"
        'layer { name: "c2" type: "Crop" bottom: "p" bottom: "data" top: "c2" }\n'
    )
    path = tmp_path / "net.prototxt"
    path.write_text(text)
    model = caffe2jax.compile(str(path), phase="TEST")
    offsets = {lay.name: list(lay.param.crop_param.offset) for lay in model.net.layers}
    assert offsets["c1"] == [] and offsets["c2"] == []
    x = np.arange(36, dtype=np.float32).reshape(1, 1, 6, 6)
    params, state = model.init(0)
    out, _ = model.apply(params, state, {"data": x, "ref": np.zeros((1, 1, 4, 4), np.float32)})
    np.testing.assert_array_equal(np.asarray(out["c1"]), x[:, :, :4, :4])
