"""The peers of the CPU table: the same nets in PyTorch eager and in OpenCV's dnn module.

PyTorch is not a caffe2jax dependency: install it for benchmarking only
(``pip install torch``, or the ``bench`` extra). OpenCV comes with the ``interop`` extra.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def torch_lenet():
    """Caffe's MNIST LeNet (conv 20, pool, conv 50, pool, ip 500, ReLU, ip 10)."""
    import torch
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, ceil_mode=True), nn.Conv2d(20, 50, 5),
        nn.MaxPool2d(2, ceil_mode=True), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(),
        nn.Linear(500, 10),
    ), torch  # fmt: skip


def torch_cifar10_quick():
    """Caffe's cifar10_quick: pools are ceil-mode (Caffe's rounding), AVE divides by the
    window clipped to the input, as torch's AvgPool2d with padding 0 does."""
    import torch
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 32, 5, padding=2), nn.MaxPool2d(3, 2, ceil_mode=True), nn.ReLU(),
        nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(), nn.AvgPool2d(3, 2, ceil_mode=True),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.AvgPool2d(3, 2, ceil_mode=True),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 64), nn.Linear(64, 10),
    ), torch  # fmt: skip


def torch_train_step(build, x: np.ndarray, y: np.ndarray, lr: float, momentum: float, decay: float):
    """One SGD step (Caffe's momentum and weight decay) of a torch net, eager, as a runner."""
    net, torch = build()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=decay)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y).long()

    def run():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(tx), ty)
        loss.backward()
        opt.step()
        return None

    return run


def opencv_forward(prototxt: Path, caffemodel: Path, x: np.ndarray, threads: int | None = None):
    """OpenCV dnn's forward of a Caffe deploy net with its weights, as a runner."""
    import cv2

    if threads is not None:
        cv2.setNumThreads(threads)
    net = cv2.dnn.readNetFromCaffe(str(prototxt), str(caffemodel))
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)

    def run():
        net.setInput(x)
        return net.forward()

    return run
