"""`caffe2jax absorb_bn DEPLOY.prototxt WEIGHTS OUT.prototxt OUT.caffemodel`: ENet's
BN-absorber (see :mod:`caffe2jax.runtime.tools.bn_absorb`): each INFERENCE-mode BN, and each
non-TRAIN SpatialDropout, that reads a convolution's output alone is folded into that
convolution's weights and removed from the net. Existing outputs are replaced only with
``--force``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from google.protobuf import text_format

from caffe2jax.cli.args import Subparsers, add_dialect


def add(sub: Subparsers) -> None:
    p = sub.add_parser(
        "absorb_bn",
        help="fold INFERENCE BN (and test-phase SpatialDropout) layers into their convolutions",
        description="ENet's BN-absorber-enet.py: W' = W·γ', b' = b·γ' + β' for each BN after a "
        "convolution (and W, b scaled by 1/(1-p) for ENet's SpatialDropout), the layer removed.",
    )
    p.add_argument("model", metavar="DEPLOY.prototxt", help="net with BN in INFERENCE mode")
    p.add_argument("weights", metavar="WEIGHTS", help="its weights (after compute_bn_stats)")
    p.add_argument("out_model", metavar="OUT.prototxt", help="the absorbed net to write")
    p.add_argument("out_weights", metavar="OUT.caffemodel", help="its weights to write")
    p.add_argument("--force", action="store_true", help="overwrite existing outputs")
    add_dialect(p, "the fork numbering WEIGHTS was written with (default: from the prototxt)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from caffe2jax.frontend.errors import NetError
    from caffe2jax.frontend.pipeline import load_param, read_param
    from caffe2jax.pycaffe.net import Net
    from caffe2jax.runtime.formats.atomic import atomic_write, refuse_overwrite
    from caffe2jax.runtime.tools.bn_absorb import absorb

    for path in (args.out_model, args.out_weights):
        refuse_overwrite(path, args.force)
        if not Path(path).resolve().parent.is_dir():  # told now, not after the whole run
            raise NetError(f"{path}: its folder does not exist")
    _, dialect = read_param(args.model, args.dialect)
    net = Net(args.model, "TEST", weights=args.weights, dialect=args.dialect)
    try:
        blobs = {name: [b.data.copy() for b in params] for name, params in net.params.items()}
    finally:
        net.close()
    absorbed, new_blobs, folded = absorb(load_param(args.model, args.dialect), blobs)
    if not folded:
        raise NetError(f"{args.model}: no BN or SpatialDropout layer reads a convolution's "
                       "output alone: nothing to absorb")  # fmt: skip
    out = Net(absorbed, "TEST", dialect=dialect)
    try:
        for name, params in out.params.items():
            for blob, value in zip(params, new_blobs[name]):
                blob.data[...] = value.reshape(blob.data.shape)
        out.save(args.out_weights)
    finally:
        out.close()
    atomic_write(args.out_model, text_format.MessageToString(absorbed), overwrite=args.force)
    print(f"Absorbed {len(folded)} layers into their convolutions; wrote {args.out_model} "
          f"and {args.out_weights}")  # fmt: skip
    return 0
