"""pycaffe misuse answered with the project's own error class in one line (caffe2jax/pycaffe/
blob.py, params.py; runtime/formats/atomic.py): a param blob reshaped by hand to a wrong shape
then ``forward`` (a NetError naming the layer, not a JAX error), ``Blob.reshape(-1, …)``
(Blob::Reshape's CHECK), ``Net.save`` to ``/proc/…`` or onto a directory (the user's path
named, not the hidden temp file)."""

from __future__ import annotations

import numpy as np
import pytest

import caffe2jax
from caffe2jax.frontend.errors import CaffeError, NetError

TEXT = """
layer { name: "data" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.1 } } }
"""


@pytest.fixture
def net(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(TEXT)
    return caffe2jax.Net(str(path), caffe2jax.TEST)


def test_a_param_reshaped_to_a_wrong_shape_is_named_at_forward(net):
    net.params["ip"][0].reshape(5, 5)
    with pytest.raises(NetError, match=r"layer 'ip': param blob 0 has shape \[5, 5\], the layer "
                                        r"needs \[4, 3\]") as error:  # fmt: skip
        net.forward(x=np.ones((2, 3), np.float32))
    assert len(str(error.value).splitlines()) == 1
    net.params["ip"][0].reshape(4, 3)  # back to its shape: the net runs again
    assert net.forward(x=np.ones((2, 3), np.float32))["y"].shape == (2, 4)


@pytest.mark.parametrize("shape", [(-1, 3), (2**31, 2), (1,) * 33])
def test_blob_reshape_refuses_what_caffe_refuses(net, shape):
    with pytest.raises(NetError, match=r"Blob.reshape"):
        net.blobs["x"].reshape(*shape)
    assert net.blobs["x"].data.shape == (2, 3)


@pytest.mark.parametrize("where", ["/proc/weights.caffemodel", "DIR"])
def test_save_names_the_users_path(net, tmp_path, where):
    path = str(tmp_path) if where == "DIR" else where
    with pytest.raises(CaffeError) as error:
        net.save(path)
    message = str(error.value)
    assert message.startswith(path) and ".tmp" not in message, message
    assert len(message.splitlines()) == 1
