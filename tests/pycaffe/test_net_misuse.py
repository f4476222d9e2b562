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


def test_a_net_past_the_memory_limit_is_a_net_error(tmp_path):
    """A param of 65535 × 32768 floats (8 GiB) under a 4 GiB address-space limit, as the fuzz
    worker runs: one NetError line when the Net is built, not a MemoryError on first read."""
    import os
    import subprocess
    import sys

    path = tmp_path / "big.prototxt"
    path.write_text(TEXT.replace("dim: 3", "dim: 32768").replace("num_output: 4",
                                                                  "num_output: 65535"))  # fmt: skip
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
        "import caffe2jax\n"
        "from caffe2jax.frontend.errors import NetError\n"
        "try:\n"
        f"    caffe2jax.Net({str(path)!r}, caffe2jax.TEST).params['ip'][0].data\n"
        "except NetError as err:\n"
        "    print('NetError:', err)\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("NetError:") and "ip" in proc.stdout, proc.stdout


def test_a_short_blobproto_is_valueerror_and_dataerror():
    from caffe2jax.frontend import caffe_pb2
    from caffe2jax.frontend.errors import DataError

    blob = caffe_pb2.BlobProto(num=65, channels=1, height=8, width=8, data=[0.0] * 64)
    with pytest.raises(ValueError) as error:
        caffe2jax.io.blobproto_to_array(blob)
    assert isinstance(error.value, DataError)
