"""DeepLab's MatWrite (runtime/data/readers/mat_write.py): each forward writes the bottom as a
MATLAB v5 .mat file named from the image-id list, read back here with scipy.io.loadmat."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.io import loadmat, whosmat

import caffe2jax
from caffe2jax.frontend.errors import DataError

# DeepLab v1's V1 syntax, as its test nets write the layer (deeplab_v1_vgg128_noup_test)
V1_NET = """name: "mat"
input: "data"
input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 4
layers {{ name: "conv" type: CONVOLUTION bottom: "data" top: "fc8"
  convolution_param {{ num_output: 3 kernel_size: 1 weight_filler {{ type: "gaussian" }} }} }}
layers {{
  name: "fc8_mat"
  type: MAT_WRITE
  bottom: "fc8"
  mat_write_param {{
    prefix: "{prefix}"
    source: "{source}"
    strip: {strip}
    period: {period}
  }}
  include: {{ phase: TEST }}
}}
"""


def _net(tmp_path, strip=0, period=1, ids=("2007_000033", "2007_000042", "2007_000061")):
    (tmp_path / "fc8").mkdir()
    source = tmp_path / "val_id.txt"
    source.write_text("".join(f"{name} extra\n" for name in ids))
    text = V1_NET.format(prefix=f"{tmp_path}/fc8/", source=source, strip=strip, period=period)
    (tmp_path / "test.prototxt").write_text(text)
    return caffe2jax.Net(str(tmp_path / "test.prototxt"), caffe2jax.TEST)


def test_each_forward_writes_the_blob_as_matlab_single_w_h_c_n(tmp_path):
    net = _net(tmp_path)
    rng = np.random.default_rng(0)
    blobs = []
    for _ in range(2):
        net.blobs["data"].data[...] = rng.normal(size=(1, 2, 3, 4))
        net.forward()
        blobs.append(net.blobs["fc8"].data.copy())
    for name, blob in zip(("2007_000033", "2007_000042"), blobs):
        path = tmp_path / "fc8" / f"{name}_blob_0.mat"
        assert whosmat(path) == [("data", (4, 3, 3, 1), "single")]
        data = loadmat(path)["data"]  # MATLAB data(w, h, c, n) = blob[n, c, h, w]
        assert data.dtype == np.float32
        np.testing.assert_array_equal(data.reshape(4, 3, 3, 1), blob.transpose(3, 2, 1, 0))
        assert path.read_bytes()[:10] == b"MATLAB 5.0"
    assert not (tmp_path / "fc8" / "2007_000061_blob_0.mat").exists()


def test_strip_and_period_and_the_end_of_the_list(tmp_path):
    """strip 2 drops two characters of each id; period 2 writes at forwards 1 and 3 (iter 0
    and 2); the fork checks the list's length only when it writes (iter 4)."""
    net = _net(tmp_path, strip=2, period=2, ids=("a_001x1", "b_002x2", "c_003x3"))
    for _ in range(4):
        net.forward()
    written = sorted(p.name for p in (tmp_path / "fc8").iterdir())
    assert written == ["a_001_blob_0.mat", "c_003_blob_0.mat"]
    with pytest.raises(DataError, match="forward 5 but the source lists only 3 images"):
        net.forward()


def test_a_missing_folder_is_a_data_error_naming_the_file(tmp_path):
    net = _net(tmp_path)
    (tmp_path / "fc8").rmdir()
    with pytest.raises(DataError, match=r"folder .*fc8 of .*2007_000033_blob_0\.mat does not"):
        net.forward()
