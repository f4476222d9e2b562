"""fcn.berkeleyvision.org's training and scoring scripts (shelhamer/fcn.berkeleyvision.org:
``voc-fcn32s/net.py``, ``solve.py``, ``surgery.py``, ``score.py``, ``voc_layers.py``) run as
they run, through ``import caffe`` (caffe2jax.install_as_caffe()), their calls transcribed:

* net.py: ``caffe.NetSpec`` with ``L.Python(module=..., layer='VOCSegDataLayer', ntop=2,
  param_str=str(dict))``, conv/ReLU in place, MAX pools, a Dropout in place, ``score_fr``, a
  bias-free ``Deconvolution`` with ``param=[dict(lr_mult=0)]``, ``caffe.coord_map.crop(upscore,
  data)`` and ``SoftmaxWithLoss(normalize=False, ignore_label=255)``, written with ``str(...)``;
* voc_layers.py's data layer: the next image and label loaded in ``reshape`` (Caffe calls it
  before every forward) with the tops reshaped to that image's size, copied in ``forward``;
  images of different sizes, so each pass runs at its own shapes;
* solve.py: ``caffe.SGDSolver``, ``surgery.interp`` on the parameters named ``up`` (bilinear
  kernels written with ``net.params[l][0].data[range(m), range(k), :, :] = filt``),
  ``solver.step``, then ``score.seg_tests``: ``solver.test_nets[0].share_with(solver.net)`` and
  ``compute_hist`` (``net.blobs[layer].channels``, a ``net.forward()`` per image, the argmax of
  ``score`` against ``label``, ``net.blobs['loss'].data.flat[0]``);
* surgery.transplant: ``new.params[p][i].data.flat = old.params[p][i].data.flat``.

The oracle: OpenCV dnn runs the scoring net (its data layer replaced by an input) with the
solver's weights after the steps (saved by ``solver.net.save``), and the histogram and the
unnormalized softmax loss are computed from its scores in float64.
"""

from __future__ import annotations

import sys
import textwrap

import cv2
import numpy as np
import pytest
from PIL import Image

import caffe2jax

caffe2jax.install_as_caffe()
import caffe  # noqa: E402 - the scripts' own imports, through the alias
from caffe import layers as L  # noqa: E402
from caffe import params as P  # noqa: E402
from caffe.coord_map import crop  # noqa: E402

SIZES = [(30, 36), (26, 28)]  # (height, width) of the two images
MEAN = (104.00699, 116.66877, 122.67892)
PARAM = [dict(lr_mult=1, decay_mult=1), dict(lr_mult=2, decay_mult=0)]

VOC_LAYERS = """
import numpy as np
from PIL import Image
import caffe


class VOCSegDataLayer(caffe.Layer):
    def setup(self, bottom, top):
        params = eval(self.param_str)
        self.voc_dir, self.mean = params["voc_dir"], np.array(params["mean"])
        split = "{}/ImageSets/Segmentation/{}.txt".format(self.voc_dir, params["split"])
        self.indices = open(split).read().splitlines()
        self.idx = 0

    def reshape(self, bottom, top):
        self.data = self.load_image(self.indices[self.idx])
        self.label = self.load_label(self.indices[self.idx])
        top[0].reshape(1, *self.data.shape)
        top[1].reshape(1, *self.label.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.data
        top[1].data[...] = self.label
        self.idx = (self.idx + 1) % len(self.indices)

    def backward(self, top, propagate_down, bottom):
        pass

    def load_image(self, idx):
        im = Image.open("{}/JPEGImages/{}.jpg".format(self.voc_dir, idx))
        in_ = np.array(im, dtype=np.float32)[:, :, ::-1]
        in_ -= self.mean
        return in_.transpose((2, 0, 1))

    def load_label(self, idx):
        im = Image.open("{}/SegmentationClass/{}.png".format(self.voc_dir, idx))
        return np.array(im, dtype=np.uint8)[np.newaxis, ...]
"""


def conv_relu(bottom, nout, ks=3, pad=1):
    conv = L.Convolution(bottom, kernel_size=ks, stride=1, num_output=nout, pad=pad, param=PARAM)
    return conv, L.ReLU(conv, in_place=True)


def fcn(split: str, voc_dir: str, module: str):
    """voc-fcn32s/net.py's fcn(split), its VGG trunk cut to two 4-channel stages."""
    n = caffe.NetSpec()
    pydata_params = dict(split=split, mean=MEAN, seed=1337, voc_dir=voc_dir)
    n.data, n.label = L.Python(module=module, layer="VOCSegDataLayer", ntop=2,
                               param_str=str(pydata_params))  # fmt: skip
    n.conv1_1, n.relu1_1 = conv_relu(n.data, 4, pad=10)
    n.pool1 = L.Pooling(n.relu1_1, pool=P.Pooling.MAX, kernel_size=2, stride=2)
    n.conv2_1, n.relu2_1 = conv_relu(n.pool1, 4)
    n.pool2 = L.Pooling(n.relu2_1, pool=P.Pooling.MAX, kernel_size=2, stride=2)
    n.fc6, n.relu6 = conv_relu(n.pool2, 8, ks=3, pad=0)
    n.drop6 = L.Dropout(n.relu6, dropout_ratio=0.5, in_place=True)
    n.score_fr = L.Convolution(n.drop6, num_output=3, kernel_size=1, pad=0, param=PARAM)
    n.upscore = L.Deconvolution(n.score_fr, param=[dict(lr_mult=0)],
                                convolution_param=dict(num_output=3, kernel_size=8, stride=4,
                                                       bias_term=False))  # fmt: skip
    n.score = crop(n.upscore, n.data)
    n.loss = L.SoftmaxWithLoss(n.score, n.label,
                               loss_param=dict(normalize=False, ignore_label=255))  # fmt: skip
    return n.to_proto()


def upsample_filt(size):
    """surgery.upsample_filt: a size² bilinear kernel."""
    factor = (size + 1) // 2
    center = factor - 1 if size % 2 == 1 else factor - 0.5
    og = np.ogrid[:size, :size]
    return (1 - abs(og[0] - center) / factor) * (1 - abs(og[1] - center) / factor)


def fast_hist(a, b, n):
    k = (a >= 0) & (a < n)
    return np.bincount(n * a[k].astype(int) + b[k], minlength=n**2).reshape(n, n)


def compute_hist(net, dataset, layer="score", gt="label"):
    """score.compute_hist without the PNG output."""
    n_cl = net.blobs[layer].channels
    hist, loss = np.zeros((n_cl, n_cl)), 0
    for _ in dataset:
        net.forward()
        hist += fast_hist(net.blobs[gt].data[0, 0].flatten(),
                          net.blobs[layer].data[0].argmax(0).flatten(), n_cl)  # fmt: skip
        loss += net.blobs["loss"].data.flat[0]
    return hist, loss / len(dataset)


@pytest.fixture
def voc(tmp_path, monkeypatch):
    """A VOC-style folder of two images and labels (255 on the first row), the layer module."""
    rng = np.random.default_rng(0)
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (tmp_path / sub).mkdir(parents=True)
    for i, (h, w) in enumerate(SIZES):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(
            tmp_path / "JPEGImages" / f"im{i}.jpg"
        )
        label = rng.integers(0, 3, (h, w), dtype=np.uint8)
        label[0] = 255
        Image.fromarray(label).save(tmp_path / "SegmentationClass" / f"im{i}.png")
    for split in ("train", "val"):
        (tmp_path / "ImageSets/Segmentation" / f"{split}.txt").write_text("im0\nim1")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    module = f"c2j_voc_layers_{tmp_path.name}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(VOC_LAYERS))
    yield tmp_path, module
    sys.modules.pop(module, None)


def _opencv_scores(tmp_path, net_text: str, weights, images):
    """OpenCV dnn's ``score`` for each image: the net with an input for its data layer."""
    deploy = net_text.split("layer {", 2)
    deploy = 'input: "data"\ninput_shape { dim: 1 dim: 3 dim: 30 dim: 36 }\nlayer {' + deploy[2]
    deploy = deploy[: deploy.index('layer {\n  name: "loss"')]
    (tmp_path / "deploy.prototxt").write_text(deploy)
    cv = cv2.dnn.readNetFromCaffe(str(tmp_path / "deploy.prototxt"), str(weights))
    cv.enableWinograd(False)
    out = []
    for image in images:
        cv.setInput(image[None])
        out.append(np.asarray(cv.forward("score"), np.float64)[0])
    return out


def test_solve_interp_step_and_seg_tests_match_opencv(voc):
    tmp_path, module = voc
    train, val = (str(fcn(split, str(tmp_path), module)) for split in ("train", "val"))
    (tmp_path / "train.prototxt").write_text(train)
    (tmp_path / "val.prototxt").write_text(val)
    (tmp_path / "solver.prototxt").write_text(
        'train_net: "train.prototxt"\ntest_net: "val.prototxt"\ntest_iter: 2\n'
        'test_interval: 999999999\ndisplay: 0\nlr_policy: "fixed"\nbase_lr: 1e-4\n'
        "momentum: 0.99\nweight_decay: 0.0005\nmax_iter: 100\ntest_initialization: false\n"
        "random_seed: 3\n"
    )
    solver = caffe.SGDSolver("solver.prototxt")
    interp_layers = [k for k in solver.net.params.keys() if "up" in k]
    assert interp_layers == ["upscore"]
    for name in interp_layers:  # surgery.interp
        m, k, h, w = solver.net.params[name][0].data.shape
        solver.net.params[name][0].data[range(m), range(k), :, :] = upsample_filt(h)
    solver.step(1)
    np.testing.assert_array_equal(  # lr_mult 0: the bilinear kernels stay
        solver.net.params["upscore"][0].data[1, 1], upsample_filt(8).astype(np.float32)
    )
    assert not solver.net.params["upscore"][0].data[0, 1].any()
    solver.test_nets[0].share_with(solver.net)  # score.seg_tests
    hist, loss = compute_hist(solver.test_nets[0], ["im0", "im1"])

    solver.net.save(str(tmp_path / "trained.caffemodel"))
    labels, images = [], []
    for i in range(2):
        labels.append(np.array(Image.open(tmp_path / f"SegmentationClass/im{i}.png")))
        rgb = np.array(Image.open(tmp_path / f"JPEGImages/im{i}.jpg"), np.float32)
        images.append((rgb[:, :, ::-1] - np.array(MEAN, np.float32)).transpose(2, 0, 1))
    scores = _opencv_scores(tmp_path, val, tmp_path / "trained.caffemodel", images)
    want_hist, want_loss = np.zeros((3, 3)), 0.0
    for score, label in zip(scores, labels):
        assert score.shape[1:] == label.shape  # the crop gives back the image's size
        want_hist += fast_hist(label.flatten(), score.argmax(0).flatten(), 3)
        logp = score - score.max(0) - np.log(np.exp(score - score.max(0)).sum(0))
        kept = label != 255
        want_loss -= np.take_along_axis(logp, np.where(kept, label, 0)[None], 0)[0][kept].sum()
    np.testing.assert_array_equal(hist, want_hist)
    np.testing.assert_allclose(loss, want_loss / 2, rtol=1e-5)


def test_transplant_coerces_inner_product_weights_into_a_convolution(tmp_path):
    """surgery.transplant / net_surgery's fully-convolutional cast: ``.data.flat`` assigned
    through the held arrays, kept by ``save``, and the convolution at one window equals the
    inner product."""
    head = 'name: "n"\ninput: "data"\ninput_shape { dim: 1 dim: 2 dim: %d dim: %d }\n'
    fc = head % (4, 4) + (
        'layer { name: "fc6" type: "InnerProduct" bottom: "data" top: "fc6" '
        'inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 } '
        'bias_filler { type: "gaussian" std: 0.5 } } }\n'
    )
    conv = head % (7, 6) + (
        'layer { name: "fc6" type: "Convolution" bottom: "data" top: "fc6" '
        "convolution_param { num_output: 5 kernel_size: 4 } }\n"
    )
    (tmp_path / "fc.prototxt").write_text(fc)
    (tmp_path / "conv.prototxt").write_text(conv)
    net = caffe.Net(str(tmp_path / "fc.prototxt"), caffe.TEST)
    new_net = caffe.Net(str(tmp_path / "conv.prototxt"), caffe.TEST)
    for p in net.params:  # surgery.transplant's loop
        for i in range(len(net.params[p])):
            assert net.params[p][i].data.shape != new_net.params[p][i].data.shape or i == 1
            new_net.params[p][i].data.flat = net.params[p][i].data.flat
    new_net.save(str(tmp_path / "conv.caffemodel"))
    again = caffe.Net(
        str(tmp_path / "conv.prototxt"), str(tmp_path / "conv.caffemodel"), caffe.TEST
    )
    x = np.random.default_rng(0).standard_normal((1, 2, 7, 6)).astype(np.float32)
    out = again.forward(data=x)["fc6"]
    w, b = (np.asarray(blob.data, np.float64) for blob in net.params["fc6"])
    for y0, x0 in ((0, 0), (3, 2), (1, 1)):
        window = x[0, :, y0 : y0 + 4, x0 : x0 + 4].astype(np.float64).ravel()
        np.testing.assert_allclose(out[0, :, y0, x0], w @ window + b, rtol=1e-5, atol=1e-5)
