"""caffe2jax/pycaffe/blob.py: a blob's array the user holds and keeps writing.

A pycaffe script writes ``net.blobs[...].data[...]`` and ``net.params[...][i].data[...]``
in place between calls. The device copy a forward or a solver step reads must be the array
as it was at that call, never memory shared with the user's array: on the CPU,
``jax.device_put`` of a NumPy array shares its buffer (even with ``may_alias=False`` in jax
0.10), so a later in-place write would change a value the program already holds.
"""

from __future__ import annotations

import numpy as np

import caffe2jax
from caffe2jax.pycaffe.blob import Blob

NET = """
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
        inner_product_param { num_output: 2 bias_term: false } }
"""


def _net(tmp_path) -> caffe2jax.Net:
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    net = caffe2jax.Net(str(path), caffe2jax.TEST)
    net.params["ip"][0].data[...] = np.arange(6, dtype=np.float32).reshape(2, 3)
    return net


def test_a_held_input_array_written_between_forwards(tmp_path):
    net = _net(tmp_path)
    x = net.blobs["x"].data  # held across calls, as scripts do
    w = net.params["ip"][0].data.copy()
    outputs = []
    for value in (1.0, 2.0, -3.0):
        x[...] = value
        outputs.append(net.forward()["y"].copy())
    for value, y in zip((1.0, 2.0, -3.0), outputs):
        np.testing.assert_array_equal(y, np.full((2, 3), value, np.float32) @ w.T)


def test_the_device_copy_is_not_the_users_memory():
    """What a program was handed stays as it was when the user writes the array again (a
    solver step runs asynchronously while the script feeds the next batch). XLA shares a
    NumPy buffer only when it is 64-byte aligned, which depends on the allocator: blobs of
    40 sizes are tried, and the aligned ones must be among them (each is 1 in 4)."""
    aligned = 0
    for rows in range(1, 41):
        blob = Blob((rows, 16))
        aligned += blob.data.ctypes.data % 64 == 0
        blob.data[...] = 1.0
        handed = blob.device_data()
        blob.data[...] = 5.0
        np.testing.assert_array_equal(np.asarray(handed), np.ones((rows, 16), np.float32))
        np.testing.assert_array_equal(np.asarray(blob.device_data()), np.full((rows, 16), 5.0))
    assert aligned > 0


def test_a_held_weight_array_written_between_forwards(tmp_path):
    net = _net(tmp_path)
    w = net.params["ip"][0].data
    net.blobs["x"].data[...] = 1.0
    for scale in (1.0, 2.0, 0.5):
        w[...] = scale * np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(net.forward()["y"], scale * np.array([[3, 12]] * 2))
