"""Real pycaffe demos run as they run, through ``import caffe`` (caffe2jax.install_as_caffe()),
their calls transcribed, each against an independent computation:

* richzhang/colorization's ``colorize.py`` on colorization_deploy_v2.prototxt's layers (widths
  shrunk): ``net.blobs['data_l'].data.shape[2:]`` / ``net.blobs['class8_ab']`` sizes, the 313
  cluster centres written into ``net.params['class8_ab'][0].data[:, :, 0, 0]`` (a layer the
  .caffemodel does not hold, so it starts at its fillers), ``caffe.io.resize_image``, a
  ``Scale`` with a constant filler and no bias, BatchNorm's global statistics, dilated
  convolutions, a Deconvolution and a ``Silence`` on the output read back from ``net.blobs``;
  against OpenCV dnn (its colorization sample runs the same prototxt);
* BVLC's examples/brewing-logreg.ipynb: ``caffe.NetSpec`` with ``L.HDF5Data`` over float64 and
  gzip-compressed HDF5 files, a ``caffe_pb2.SolverParameter`` written with ``str()``,
  ``caffe.get_solver``, ``solver.solve()``, then the accuracy summed over
  ``solver.test_nets[0].forward()``; against NumPy's accuracy of the trained weights;
* BVLC's examples/net_surgery.ipynb, first half: a view ``net.blobs['conv'].data[0, 0]`` taken
  before a surgery follows the next ``forward()`` (pycaffe's arrays are views of the blob), the
  Gaussian and Sobel filters written into ``net.params['conv'][0].data``; against SciPy.
"""

from __future__ import annotations

import cv2
import h5py
import numpy as np
from scipy import signal

import caffe2jax

caffe2jax.install_as_caffe()
import caffe  # noqa: E402 - the demos' own imports, through the alias
from caffe import layers as L  # noqa: E402
from caffe.proto import caffe_pb2  # noqa: E402

# colorization_deploy_v2's blocks: (block, [(num_output, pad, stride, dilation) per conv]);
# each block's last convolution kept (its stride or dilation), the widths shrunk
BLOCKS = [
    ("1", [(4, 1, 1, 1), (4, 1, 2, 1)]),
    ("2", [(8, 1, 2, 1)]),
    ("3", [(8, 1, 2, 1)]),
    ("4", [(16, 1, 1, 1)]),
    ("5", [(16, 2, 1, 2)]),
    ("6", [(16, 2, 1, 2)]),
    ("7", [(16, 1, 1, 1)]),
]


def _conv(name, bottom, top, n, k=3, pad=1, stride=1, dil=1, kind="Convolution") -> str:
    return (
        f'layer {{ name: "{name}" type: "{kind}" bottom: "{bottom}" top: "{top}" '
        f"convolution_param {{ num_output: {n} kernel_size: {k} pad: {pad} stride: {stride} "
        f"dilation: {dil} }} }}\n"
        + (f'layer {{ name: "relu{top[4:]}" type: "ReLU" bottom: "{top}" top: "{top}" }}\n'
           if kind == "Deconvolution" or k == 3 else "")
    )  # fmt: skip


def colorization_net(decoder: bool = True) -> str:
    """colorization_deploy_v2.prototxt's layers (``decoder``: class8_ab and the Silence)."""
    text = 'name: "LtoAB"\nlayer { name: "data_l" type: "Input" top: "data_l" '
    text += "input_param { shape { dim: 1 dim: 1 dim: 32 dim: 32 } } }\n"
    bottom = "data_l"
    for block, convs in BLOCKS:
        for i, (n, pad, stride, dil) in enumerate(convs, 1):
            top = f"conv{block}_{i}"
            name = "bw_conv1_1" if top == "conv1_1" else top
            text += _conv(name, bottom, top, n, pad=pad, stride=stride, dil=dil)
            bottom = top
        norm = f"{bottom}norm"
        frozen = "param { lr_mult: 0 decay_mult: 0 } " * 3
        text += (f'layer {{ name: "{norm}" type: "BatchNorm" bottom: "{bottom}" top: "{norm}" '
                 f"batch_norm_param {{ }} {frozen}}}\n")  # fmt: skip
        bottom = norm
    text += _conv("conv8_1", bottom, "conv8_1", 8, k=4, stride=2, kind="Deconvolution")
    text += _conv("conv8_2", "conv8_1", "conv8_2", 8) + _conv("conv8_3", "conv8_2", "conv8_3", 8)
    text += _conv("conv8_313", "conv8_3", "conv8_313", 313, k=1, pad=0)
    text += (
        'layer { name: "conv8_313_rh" type: "Scale" bottom: "conv8_313" top: "conv8_313_rh" '
        "scale_param { bias_term: False filler { type: 'constant' value: 2.606 } } }\n"
        'layer { name: "class8_313_rh" type: "Softmax" bottom: "conv8_313_rh" '
        'top: "class8_313_rh" }\n'
    )
    if decoder:
        text += _conv("class8_ab", "class8_313_rh", "class8_ab", 2, k=1, pad=0)
        text += 'layer { name: "Silence" type: "Silence" bottom: "class8_ab" }\n'
    return text


def test_colorize_writes_cluster_centres_and_matches_opencv(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "release.prototxt").write_text(colorization_net(decoder=False))
    (tmp_path / "deploy.prototxt").write_text(colorization_net())
    release = caffe.Net(str(tmp_path / "release.prototxt"), caffe.TEST)
    for name, blobs in release.params.items():
        if name.endswith("norm"):  # mean, variance, the moving-average factor
            blobs[0].data[...] = rng.normal(0, 0.1, blobs[0].data.shape)
            blobs[1].data[...] = rng.uniform(0.5, 2, blobs[1].data.shape)
            blobs[2].data[...] = 1
        elif name != "conv8_313_rh":  # the Scale keeps its 2.606
            std = 0.02 if name == "conv8_313" else 0.3  # a smooth softmax over the 313 bins
            for blob in blobs:
                blob.data[...] = rng.normal(0, std, blob.data.shape)
    release.save(str(tmp_path / "release.caffemodel"))

    net = caffe.Net(str(tmp_path / "deploy.prototxt"), str(tmp_path / "release.caffemodel"),
                    caffe.TEST)  # fmt: skip
    (H_in, W_in) = net.blobs["data_l"].data.shape[2:]
    (H_out, W_out) = net.blobs["class8_ab"].data.shape[2:]
    assert (H_in, W_in, H_out, W_out) == (32, 32, 8, 8)
    assert not net.params["class8_ab"][0].data.any()  # not in the weights: its filler, 0
    np.testing.assert_array_equal(net.params["conv8_313_rh"][0].data, np.float32(2.606))
    pts_in_hull = rng.uniform(-110, 110, (313, 2))
    net.params["class8_ab"][0].data[:, :, 0, 0] = pts_in_hull.transpose((1, 0))
    img_rgb = rng.uniform(0, 1, (40, 50, 3))
    img_rs = caffe.io.resize_image(img_rgb, (H_in, W_in))
    net.blobs["data_l"].data[0, 0, :, :] = img_rs[:, :, 0] * 100 - 50  # L of the image, centred
    assert net.forward() == {}  # the Silence consumes the only output
    ab_dec = net.blobs["class8_ab"].data[0, :, :, :].transpose((1, 2, 0))

    net.save(str(tmp_path / "full.caffemodel"))
    cv = cv2.dnn.readNetFromCaffe(
        str(tmp_path / "deploy.prototxt"), str(tmp_path / "full.caffemodel")
    )
    cv.enableWinograd(False)  # its fast 3×3 convolutions round differently
    cv.setInput(np.array(net.blobs["data_l"].data))
    want = cv.forward("class8_ab")[0].transpose((1, 2, 0))
    # a softmax-weighted mean of centres up to 110: float32 sums in two orders, 2e-5 of that
    np.testing.assert_allclose(ab_dec, want, rtol=0, atol=2e-3)
    assert np.ptp(want) > 1  # the softmax is not flat: the comparison says something


def test_brewing_logreg_solve_then_test_accuracy_matches_numpy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 4))
    y = (X[:, 0] + 0.5 * X[:, 1] - 0.3 * X[:, 3] > 0).astype(int)
    X, Xt, y, yt = X[:200], X[200:], y[:200], y[200:]
    with h5py.File("train.h5", "w") as f:
        f["data"] = X  # float64, read as float
        f["label"] = y.astype(np.float32)
    (tmp_path / "train.txt").write_text(f"{tmp_path / 'train.h5'}\n" * 2)
    with h5py.File("test.h5", "w") as f:
        f.create_dataset("data", data=Xt, compression="gzip", compression_opts=1)
        f.create_dataset(
            "label", data=yt.astype(np.float32), compression="gzip", compression_opts=1
        )
    (tmp_path / "test.txt").write_text(f"{tmp_path / 'test.h5'}\n")

    def logreg(hdf5, batch_size):
        n = caffe.NetSpec()
        n.data, n.label = L.HDF5Data(batch_size=batch_size, source=hdf5, ntop=2)
        n.ip1 = L.InnerProduct(n.data, num_output=2, weight_filler=dict(type="xavier"))
        n.accuracy = L.Accuracy(n.ip1, n.label)
        n.loss = L.SoftmaxWithLoss(n.ip1, n.label)
        return n.to_proto()

    (tmp_path / "train.prototxt").write_text(str(logreg("train.txt", 10)))
    (tmp_path / "test.prototxt").write_text(str(logreg("test.txt", 10)))
    s = caffe_pb2.SolverParameter()
    s.train_net, s.test_interval, s.max_iter, s.base_lr = "train.prototxt", 1000, 60, 0.1
    s.test_net.append("test.prototxt")
    s.test_iter.append(10)
    s.lr_policy, s.gamma, s.stepsize, s.momentum, s.weight_decay = "step", 0.1, 40, 0.9, 5e-4
    s.display, s.snapshot, s.snapshot_prefix = 0, 60, "train"
    s.solver_mode = caffe_pb2.SolverParameter.CPU
    (tmp_path / "solver.prototxt").write_text(str(s))

    solver = caffe.get_solver("solver.prototxt")
    solver.solve()
    accuracy = 0
    batch_size = solver.test_nets[0].blobs["data"].num
    test_iters = int(len(Xt) / batch_size)
    for _ in range(test_iters):
        solver.test_nets[0].forward()
        accuracy += solver.test_nets[0].blobs["accuracy"].data
    accuracy /= test_iters

    w, b = (np.asarray(blob.data, np.float64) for blob in solver.net.params["ip1"])
    want = np.mean((Xt.astype(np.float32).astype(np.float64) @ w.T + b).argmax(1) == yt)
    assert solver.iter == 60 and (tmp_path / "train_iter_60.caffemodel").exists()
    np.testing.assert_allclose(accuracy, want, rtol=1e-6)
    assert want > 0.8  # it learned


NET_SURGERY_CONV = """name: "convolution"
input: "data"
input_dim: 1
input_dim: 1
input_dim: 100
input_dim: 100
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 3 kernel_size: 5 stride: 1
    weight_filler { type: "gaussian" std: 0.01 } bias_filler { type: "constant" value: 0 } } }
"""


def test_net_surgery_views_follow_forward_and_written_filters_apply(tmp_path):
    (tmp_path / "conv.prototxt").write_text(NET_SURGERY_CONV)
    net = caffe.Net(str(tmp_path / "conv.prototxt"), caffe.TEST)
    im = np.random.default_rng(0).uniform(0, 1, (24, 30)).astype(np.float32)
    im_input = im[np.newaxis, np.newaxis, :, :]
    net.blobs["data"].reshape(*im_input.shape)
    net.blobs["data"].data[...] = im_input
    net.forward()
    conv0 = net.blobs["conv"].data[0, 0]
    before = conv0.mean()
    net.params["conv"][1].data[0] = 1.0
    net.forward()
    np.testing.assert_allclose(conv0.mean(), before + 1, rtol=1e-5)  # the old view, new data

    ksize = net.params["conv"][0].data.shape[2:]
    y, x = np.mgrid[-ksize[0] // 2 + 1 : ksize[0] // 2 + 1, -ksize[1] // 2 + 1 : ksize[1] // 2 + 1]
    g = np.exp(-((x**2 + y**2) / 2.0))
    gaussian = (g / g.sum()).astype(np.float32)
    net.params["conv"][0].data[0] = gaussian
    net.params["conv"][0].data[1:] = 0.0
    sobel = np.array((-1, -2, -1, 0, 0, 0, 1, 2, 1), dtype=np.float32).reshape((3, 3))
    net.params["conv"][0].data[1, 0, 1:-1, 1:-1] = sobel
    net.params["conv"][0].data[2, 0, 1:-1, 1:-1] = sobel.T
    net.forward()
    image = im.astype(np.float64)
    np.testing.assert_allclose(conv0, signal.correlate2d(image, gaussian, "valid") + 1, atol=1e-5)
    for c in (1, 2):  # the Sobel operators inside 5×5 kernels of zeros
        kernel = np.asarray(net.params["conv"][0].data[c, 0], np.float64)
        want = signal.correlate2d(image, kernel, "valid")
        np.testing.assert_allclose(net.blobs["conv"].data[0, c], want, atol=1e-5)


def test_outputs_are_listed_by_name_as_caffes_net_init_does(tmp_path):
    """Net::Init takes the unconsumed blobs from a std::set<string>: ``net.outputs`` is in
    bytewise name order (OpenPose's demo picks its heatmaps as the second output)."""
    convs = "".join(
        f'layer {{ name: "{t}" type: "Convolution" bottom: "data" top: "{t}" '
        "convolution_param { num_output: 1 kernel_size: 1 } }\n"
        for t in ("zz", "bb", "Mconv7_stage6_L2", "Mconv7_stage6_L1")
    )
    (tmp_path / "n.prototxt").write_text(
        'input: "data"\ninput_shape { dim: 1 dim: 1 dim: 2 dim: 2 }\n' + convs
    )
    net = caffe.Net(str(tmp_path / "n.prototxt"), caffe.TEST)
    assert net.outputs == ["Mconv7_stage6_L1", "Mconv7_stage6_L2", "bb", "zz"]
    assert list(net.forward()) == net.outputs
