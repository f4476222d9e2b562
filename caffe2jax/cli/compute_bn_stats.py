"""`caffe2jax compute_bn_stats TRAIN.prototxt WEIGHTS OUT.caffemodel`: SegNet's
compute_bn_statistics.py (see :mod:`caffe2jax.runtime.tools.bn_stats` for what it computes).

Runs the train net's statistics form in the TEST phase over ``--iters`` batches of its training
data (default: the script's count from the DenseImageData list), folds the average batch
statistics into each BN's scale and shift, and writes the weights for ``bn_mode: INFERENCE``
to OUT; ``--inference-prototxt`` also writes the script's inference net. Existing outputs are
replaced only with ``--force``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from google.protobuf import text_format

from caffe2jax.cli.args import Subparsers, int32
from caffe2jax.frontend.errors import NetError


def add(sub: Subparsers) -> None:
    p = sub.add_parser(
        "compute_bn_stats",
        help="fold SegNet/ENet BN batch statistics into INFERENCE weights",
        description="SegNet-Tutorial's compute_bn_statistics.py: average each BN's batch mean "
        "and variance over the training data and fold them into its scale and shift, for "
        "bn_mode INFERENCE.",
    )
    p.add_argument("model", metavar="TRAIN.prototxt", help="the train net (BN in LEARN mode)")
    p.add_argument("weights", metavar="WEIGHTS", help="its trained .caffemodel (or .h5)")
    p.add_argument("out", metavar="OUT.caffemodel", help="the folded weights to write")
    p.add_argument("--iters", type=int32, help="forwards to average (default: list size // "
                   "batch + list size %% batch, as the script)")  # fmt: skip
    p.add_argument(
        "--inference-prototxt",
        metavar="FILE",
        help="also write the inference net (BN INFERENCE, input data, Softmax prob)",
    )
    p.add_argument("--unbias", action="store_true",
                   help="multiply σ² by m/(m-1) (the script under Python 3; its Python 2 "
                   "integer division made the factor 1)")  # fmt: skip
    p.add_argument("--force", action="store_true", help="overwrite existing outputs")
    p.set_defaults(func=run)


def _default_iterations(stats, base_dir: Path) -> int:
    from caffe2jax.runtime.data.files import resolve_input
    from caffe2jax.runtime.data.readers.pair_list import parse_pair_list
    from caffe2jax.runtime.tools.bn_stats import default_iterations

    data = next((layer for layer in stats.layer if layer.type == "DenseImageData"), None)
    if data is None:
        raise NetError("the net has no DenseImageData layer to count its training list: "
                       "give --iters")  # fmt: skip
    p = data.dense_image_data_param
    pairs = parse_pair_list(resolve_input(p.source, base_dir, f"layer {data.name!r}: source"))
    return default_iterations(len(pairs), p.batch_size)


def run(args: argparse.Namespace) -> int:
    from caffe2jax.frontend.pipeline import load_param, read_param
    from caffe2jax.pycaffe.net import Net
    from caffe2jax.runtime.formats.atomic import atomic_write, refuse_overwrite
    from caffe2jax.runtime.tools import bn_stats

    outputs = [args.out] + ([args.inference_prototxt] if args.inference_prototxt else [])
    for path in outputs:
        refuse_overwrite(path, args.force)
        if not Path(path).resolve().parent.is_dir():  # told now, not after the whole run
            raise NetError(f"{path}: its folder does not exist")
    if args.iters is not None and args.iters < 1:
        raise NetError(f"--iters must be at least 1, got {args.iters}")
    _, dialect = read_param(args.model)
    stats, bns = bn_stats.statistics_net(load_param(args.model))
    base_dir = Path(args.model).parent
    iters = args.iters or _default_iterations(stats, base_dir)
    data_top = next((ly.top[0] for ly in stats.layer if ly.type.endswith("Data")), None)
    if args.inference_prototxt and data_top is None:
        raise NetError("--inference-prototxt replaces the net's data layer by an input, and "
                       "the net has no data layer")  # fmt: skip
    net = Net(stats, "TEST", weights=args.weights, base_dir=base_dir, dialect=dialect)
    try:
        averager = bn_stats.Averager(bns)
        for i in range(iters):
            net.forward()
            names = [n for bn in bns for n in (bn.mean, bn.var)]
            averager.add({n: net.blobs[n].data for n in names},
                         {bn.top: net.blobs[bn.top].data.shape for bn in bns})  # fmt: skip
            print(f"progress: {i + 1}/{iters}")
        for layer, (mean, var, m) in averager.means().items():
            scale, shift = net.params[layer][0].data, net.params[layer][1].data
            scale[...], shift[...] = bn_stats.fold(scale, shift, mean, var, m, args.unbias)
        net.save(args.out)
        print(f"Wrote {len(bns)} BN layers' folded statistics ({iters} batches) to {args.out}")
        if args.inference_prototxt:
            shape = (1, *net.blobs[data_top].data.shape[1:])
            text = text_format.MessageToString(bn_stats.inference_net(stats, shape))
            atomic_write(args.inference_prototxt, text, overwrite=args.force)
            print(f"Wrote the inference net to {args.inference_prototxt}")
    finally:
        net.close()
    return 0
