"""Shape inference never builds host arrays proportional to a blob: a net declaring a
half-billion-row padded AVE pooling (2e9 values, just under Caffe's INT_MAX count) compiles
its shapes within a small address space."""

from __future__ import annotations

import subprocess
import sys
import textwrap

HUGE_POOL = """
layer { name: "in" type: "Input" top: "data"
        input_param { shape { dim: 1 dim: 1 dim: 500000000 dim: 4 } } }
layer { name: "pool" type: "Pooling" bottom: "data" top: "p"
        pooling_param { pool: AVE kernel_size: 3 pad: 1 stride: 1 } }
"""


def test_padded_ave_pooling_shapes_need_no_host_memory():
    script = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        import caffe2jax
        from caffe2jax.frontend.errors import NetError
        from caffe2jax.runtime.parallel.memory import check_net_fits
        model = caffe2jax.compile({HUGE_POOL!r})
        print(model.net.shapes[model.net.blob_names["p"]])
        try:
            check_net_fits(model.net, available=1 << 30)
        except NetError as err:
            print(err)
    """)  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={"JAX_PLATFORMS": "cpu", "PATH": ""})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    shape, message = proc.stdout.strip().splitlines()
    assert shape == "(1, 1, 500000000, 4)"
    assert "its blobs need 14.9 GiB, more than the 1 GiB available" in message
    assert "(largest: 'data' [1, 1, 500000000, 4])" in message
