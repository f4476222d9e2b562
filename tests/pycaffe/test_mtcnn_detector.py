"""MTCNN's pycaffe face detector (DuinoDu/mtcnn demo.py's ``detect_face``, the pycaffe port of
kpzhang93's MATLAB detector) run as it runs, through ``import caffe``
(caffe2jax.install_as_caffe()): three nets of PReLU layers (P-, R- and O-Net, det1..3.prototxt's
layers and widths, written here from their layer lists), ``PNet.blobs['data'].reshape(1, 3, ws,
hs)`` then ``.data[...] =`` and ``out = PNet.forward()`` once per pyramid scale (the image fed
transposed: width before height, as the script does), then R-Net and O-Net on a batch of
``numbox`` crops each (``reshape(numbox, 3, 24, 24)`` / ``(numbox, 3, 48, 48)``), reading
``out['prob1']``, ``out['conv4-2']``, ``out['conv5-2']``, ``out['conv6-2']``,
``out['conv6-3']``.

The oracle: OpenCV dnn runs the same weights (saved by ``net.save``) on the same inputs at
every step; the stages' boxes are chosen from OpenCV's scores, so both run the same crops.
With DuinoDu's real det1..3.caffemodel and its test images (not in this repository) the
script's final boxes equal OpenCV's to 1.3e-5 px (checked by hand; README, "Porting a
pycaffe script").
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

import caffe2jax

caffe2jax.install_as_caffe()
import caffe  # noqa: E402 - the script's own import, through the alias


def _layers(spec: list[tuple]) -> str:
    """Layers from (kind, name, bottom, arg): conv (num, k), prelu, pool (k, s), ip, softmax."""
    text = []
    for kind, name, bottom, *arg in spec:
        top = bottom if kind == "prelu" else name
        head = f'layer {{ name: "{name}" bottom: "{bottom}" top: "{top}" '
        if kind == "conv":
            text.append(head + 'type: "Convolution" convolution_param { '
                        f"num_output: {arg[0]} kernel_size: {arg[1]} stride: 1 }} }}")  # fmt: skip
        elif kind == "pool":
            text.append(head + 'type: "Pooling" pooling_param { pool: MAX '
                        f"kernel_size: {arg[0]} stride: {arg[1]} }} }}")  # fmt: skip
        elif kind == "ip":
            text.append(
                head + f'type: "InnerProduct" inner_product_param {{ num_output: {arg[0]} }} }}'
            )
        else:
            text.append(head + f'type: "{"PReLU" if kind == "prelu" else "Softmax"}" }}')
    return "\n".join(text)


def _net(name: str, size: int, spec: list[tuple]) -> str:
    dims = "".join(f"input_dim: {d}\n" for d in (1, 3, size, size))
    return f'name: "{name}"\ninput: "data"\n{dims}' + _layers(spec) + "\n"


PNET = _net("PNet", 12, [
    ("conv", "conv1", "data", 10, 3), ("prelu", "PReLU1", "conv1"),
    ("pool", "pool1", "conv1", 2, 2),
    ("conv", "conv2", "pool1", 16, 3), ("prelu", "PReLU2", "conv2"),
    ("conv", "conv3", "conv2", 32, 3), ("prelu", "PReLU3", "conv3"),
    ("conv", "conv4-1", "conv3", 2, 1), ("conv", "conv4-2", "conv3", 4, 1),
    ("softmax", "prob1", "conv4-1"),
])  # fmt: skip
RNET = _net("RNet", 24, [
    ("conv", "conv1", "data", 28, 3), ("prelu", "prelu1", "conv1"),
    ("pool", "pool1", "conv1", 3, 2),
    ("conv", "conv2", "pool1", 48, 3), ("prelu", "prelu2", "conv2"),
    ("pool", "pool2", "conv2", 3, 2),
    ("conv", "conv3", "pool2", 64, 2), ("prelu", "prelu3", "conv3"),
    ("ip", "conv4", "conv3", 128), ("prelu", "prelu4", "conv4"),
    ("ip", "conv5-1", "conv4", 2), ("ip", "conv5-2", "conv4", 4), ("softmax", "prob1", "conv5-1"),
])  # fmt: skip
ONET = _net("ONet", 48, [
    ("conv", "conv1", "data", 32, 3), ("prelu", "prelu1", "conv1"),
    ("pool", "pool1", "conv1", 3, 2),
    ("conv", "conv2", "pool1", 64, 3), ("prelu", "prelu2", "conv2"),
    ("pool", "pool2", "conv2", 3, 2),
    ("conv", "conv3", "pool2", 64, 3), ("prelu", "prelu3", "conv3"),
    ("pool", "pool3", "conv3", 2, 2),
    ("conv", "conv4", "pool3", 128, 2), ("prelu", "prelu4", "conv4"),
    ("ip", "conv5", "conv4", 256), ("prelu", "prelu5", "conv5"),
    ("ip", "conv6-1", "conv5", 2), ("ip", "conv6-2", "conv5", 4), ("ip", "conv6-3", "conv5", 10),
    ("softmax", "prob1", "conv6-1"),
])  # fmt: skip


class _OpenCV:
    """The oracle: the same prototxt and weights in OpenCV dnn, fed what the script fed."""

    def __init__(self, proto, weights):
        self.net = cv2.dnn.readNetFromCaffe(str(proto), str(weights))
        self.net.enableWinograd(False)  # its fast 3×3 convolutions round differently

    def forward(self, data, names):
        self.net.setInput(np.asarray(data, np.float32))
        return dict(zip(names, self.net.forward(list(names))))


@pytest.fixture(scope="module")
def nets(tmp_path_factory):
    """{name: (caffe.Net with the saved weights, OpenCV's twin)} for PNet, RNet, ONet."""
    folder, rng, out = tmp_path_factory.mktemp("mtcnn"), np.random.default_rng(0), {}
    for name, text in (("PNet", PNET), ("RNet", RNET), ("ONet", ONET)):
        proto = folder / f"{name}.prototxt"
        proto.write_text(text)
        net = caffe.Net(str(proto), caffe.TEST)
        for layer in net.params:
            for blob in net.params[layer]:
                blob.data[...] = rng.normal(0, 0.1, blob.data.shape)
        net.save(str(folder / f"{name}.caffemodel"))
        weights = str(folder / f"{name}.caffemodel")
        out[name] = (caffe.Net(str(proto), weights, caffe.TEST), _OpenCV(proto, weights))
    return out


def _check(out: dict, want: dict) -> None:
    assert set(out) == set(want)  # forward() returns the net's outputs, no more
    for key, value in want.items():  # float32 sums in two orders: 1e-5 of the output's scale
        atol = 1e-5 * np.abs(value).max()
        np.testing.assert_allclose(out[key], value, rtol=0, atol=atol, err_msg=key)


def _crops(img: np.ndarray, boxes: np.ndarray, size: int) -> np.ndarray:
    """Each box cut from the image, resized to size² and scaled to [-1, 1], as (n, 3, W, H)."""
    patches = [cv2.resize(img[y0:y1, x0:x1], (size, size)) for x0, y0, x1, y1 in boxes]
    return np.swapaxes((np.array(patches) - 127.5) * 0.0078125, 1, 3)


def test_detect_face_calls_match_opencv_at_every_scale_and_batch(nets):
    (pnet, p_cv), (rnet, r_cv), (onet, o_cv) = nets["PNet"], nets["RNet"], nets["ONet"]
    img = np.random.default_rng(1).uniform(0, 255, (31, 38, 3))
    h, w = img.shape[:2]
    boxes = []
    for scale in (1.0, 0.709, 0.709**2):  # the pyramid (minsize 12, factor 0.709)
        hs, ws = int(np.ceil(h * scale)), int(np.ceil(w * scale))
        im_data = (cv2.resize(img, (ws, hs)) - 127.5) * 0.0078125
        im_data = np.array([np.swapaxes(im_data, 0, 2)], dtype=float)
        pnet.blobs["data"].reshape(1, 3, ws, hs)
        pnet.blobs["data"].data[...] = im_data
        out = pnet.forward()
        want = p_cv.forward(im_data, ("prob1", "conv4-2"))
        _check(out, want)
        pooled = [-(-(n - 4) // 2) + 1 for n in (ws, hs)]  # Caffe's pooling rounds up
        assert out["prob1"].shape == (1, 2, pooled[0] - 4, pooled[1] - 4)
        # the 12×12 cell of each of the two best scores (map transposed, as the script reads it)
        best = np.argsort(want["prob1"][0, 1].T.ravel())[-2:]
        for y, x in zip(*np.unravel_index(best, want["prob1"].shape[2:][::-1])):
            x0, y0 = int(2 * x / scale), int(2 * y / scale)
            boxes.append((x0, y0, min(w, x0 + int(12 / scale)), min(h, y0 + int(12 / scale))))
    boxes = np.array(boxes)
    for net, twin, size, names in (
        (rnet, r_cv, 24, ("prob1", "conv5-2")),
        (onet, o_cv, 48, ("prob1", "conv6-2", "conv6-3")),
    ):
        numbox = len(boxes) - (size == 48)  # O-Net on fewer boxes: another batch size
        tempimg = _crops(img, boxes[:numbox], size)
        net.blobs["data"].reshape(numbox, 3, size, size)
        net.blobs["data"].data[...] = tempimg
        out = net.forward()
        _check(out, twin.forward(tempimg, names))
        assert out["prob1"].shape == (numbox, 2)
