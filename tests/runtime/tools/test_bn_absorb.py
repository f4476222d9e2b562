"""runtime/tools/bn_absorb.py on ENet's own deploy net
(../shared/forks/models/enet_deploy_bn.prototxt): the layers folded by dataflow are exactly those
BN-absorber-enet.py folds by position (every BN right after a Convolution — not bn0_1 after the
Concat, nor the BNs after Deconvolutions — and every SpatialDropout), and the net left reads only
blobs that are still written."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from caffe2jax.frontend.pipeline import load_param
from caffe2jax.runtime.tools.bn_absorb import absorb

ENET = Path(__file__).resolve().parents[3].parent / "shared/forks/models/enet_deploy_bn.prototxt"


def test_enet_deploy_folds_what_the_script_folds():
    net = load_param(ENET)
    layers = list(net.layer)
    blobs = {}
    for layer in layers:
        if layer.type == "Convolution":
            n = layer.convolution_param.num_output
            blobs[layer.name] = [np.ones((n, 1, 1, 1)), np.zeros(n)]
        elif layer.type == "BN":
            blobs[layer.name] = [np.ones(1), np.zeros(1)]
    script = {layer.name for i, layer in enumerate(layers)
              if (layer.type == "BN" and layer.name != "bn0_1"
                  and layers[i - 1].type != "Deconvolution") or layer.type == "Python"}  # fmt: skip
    absorbed, _, folded = absorb(net, blobs)
    assert set(folded) == script and len(folded) == 110
    written = {"data"}
    for layer in absorbed.layer:
        assert set(layer.bottom) <= written, layer.name
        written.update(layer.top)
    assert not any(layer.type == "Python" for layer in absorbed.layer)
