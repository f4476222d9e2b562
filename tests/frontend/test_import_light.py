"""The frontend and the Net IR load without JAX or the runtime (DESIGN.md: the IR is plain
data, testable without JAX)."""

from __future__ import annotations

import subprocess
import sys


def test_frontend_imports_without_jax():
    code = (
        "import sys, caffe2jax.frontend.pipeline as p, caffe2jax.frontend.splits\n"
        'net = p.load_net(\'layer { name: "i" type: "Input" top: "x" '
        "input_param { shape { dim: 1 } } }', 'TEST')\n"
        "heavy = [m for m in sys.modules if m == 'jax' or m.startswith(('jax.', "
        "'caffe2jax.runtime', 'caffe2jax.lowering'))]\n"
        "assert not heavy, heavy\n"
        "print(net.layers[0].name)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "i"


def test_public_names_resolve_lazily():
    import caffe2jax

    for name in caffe2jax.__all__:
        assert getattr(caffe2jax, name) is not None, name
    assert caffe2jax.TRAIN == 0 and caffe2jax.TEST == 1
