#!/usr/bin/env python
"""Train py-R-FCN's ResNet-50 OHEM net on a synthetic box set with caffe2jax's built-in R-FCN
layers, through the CLI, then evaluate it (VOC AP at IoU 0.5).

    python examples/detection/rfcn_train.py WORKDIR [--iters 600] [--size 128] [--count 48]
        [--snapshot 100] [--lr 0.001] [--stepsize 80000]

The net is read from ``../shared/forks/models/rfcn_resnet50_voc_train_ohem.prototxt`` (never
copied into the repository) and rewritten only in data paths and sizes:

* the RoIDataLayer's ``param_str`` gets the LMDB ``source`` and ``scale`` = the image side;
  ``num_classes`` 4 (background + 3 shapes): ``rfcn_cls`` 4·7² outputs and the class
  PSROIPooling's ``output_dim`` 4. The box branch is class-agnostic (``rfcn_bbox`` 2·4·7²,
  the ProposalTargetLayer's ``num_classes`` 2) and stays as it is;
* the anchor target and proposal layers get ``'scales': (2, 4, 8)`` (anchors of 32–128 px
  for 128-px images instead of 128–512 px for 600-px ones).

The built-in proposal and proposal target layers take their py-R-FCN form (the net's dialect
is R-FCN's; lowering/forks/rfcn.py): rfcn_end2end_ohem.yml's 6000 / 300 proposals and every
proposal kept with class-agnostic targets. The solver is py-R-FCN's ResNet-50
rfcn_end2end/solver_ohem.prototxt (base_lr 0.001, step 0.1 at 80000, momentum 0.9,
weight_decay 0.0005, iter_size 2) with display, ``max_iter`` and ``snapshot`` set here
(``--lr`` and ``--stepsize`` change base_lr and the step for a from-scratch run).

py-R-FCN starts from ImageNet ResNet-50 weights; there are none here, so ``init.caffemodel`` holds
random weights (:func:`init_weights`): MSRA convolutions, Scale γ 1 and β 0, and — since the
prototxt's BatchNorm layers use global statistics and are frozen (lr_mult 0) like conv1, res2 and
the Scale layers — BatchNorm statistics measured on synthetic images as an ImageNet model's were:
the backbone (up to res5c) with batch statistics on 16 images, one forward, whose BatchNorm blobs
then hold those statistics (Caffe's moving average from 0). Evaluation: the test net is derived as
py-R-FCN's test_agonistic.prototxt is written (frcnn_eval.py, R-FCN's train-only layers
dropped) and loads the snapshot as it is: caffe2jax's snapshot of a net running the built-in
py-R-FCN layers is already un-normalised as py-R-FCN's train.py writes it (``rpn_bbox_pred``:
weights × stds tiled over the anchors; ``rfcn_bbox``: × stds repeated 7² times per output;
bias × stds + means; runtime/train/snapshots.py), box deltas class-agnostic (slot 1 for every
class, as test.py with TEST.AGONISTIC).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples.detection.frcnn_train import prepare_work, rewrite_data, train_and_evaluate  # noqa: E402

MODEL = ROOT.parent / "shared" / "forks" / "models" / "rfcn_resnet50_voc_train_ohem.prototxt"
CLASSES = 4
GROUP = 7
TRAIN_ONLY = ("rpn-data", "rpn_loss_cls", "rpn_loss_bbox", "roi-data", "per_roi_loss_cls",
              "per_roi_loss_bbox", "per_roi_loss", "annotator_detector", "silence", "loss",
              "accuarcy", "loss_bbox")  # fmt: skip


def train_prototxt(lmdb: Path, size: int, source: Path = MODEL) -> str:
    """The fork's train prototxt with data paths and sizes rewritten (module docstring)."""
    text = rewrite_data(source.read_text(), lmdb, size, CLASSES)
    text = re.sub(r"num_output: 1029\b", f"num_output: {CLASSES * GROUP * GROUP}", text)
    return re.sub(r"output_dim: 21\b", f"output_dim: {CLASSES}", text)


def solver_text(net: Path, prefix: Path, max_iter: int, snapshot: int, lr: float = 0.001,
                stepsize: int = 80000) -> str:  # fmt: skip
    return (
        f'train_net: "{net}"\nbase_lr: {lr}\nlr_policy: "step"\ngamma: 0.1\n'
        f"stepsize: {stepsize}\ndisplay: 20\naverage_loss: 20\nmomentum: 0.9\n"
        f'weight_decay: 0.0005\nsnapshot: {snapshot}\nsnapshot_prefix: "{prefix}"\n'
        f"iter_size: 2\nmax_iter: {max_iter}\nrandom_seed: 1\n"
    )


def backbone_text(train_text: str, size: int, batch: int) -> str:
    """The train net's layers up to ``res5c_relu`` on an Input of ``batch`` images, its
    BatchNorm layers computing batch statistics (``use_global_stats: false``)."""
    from google.protobuf import text_format

    from caffe2jax.frontend import caffe_pb2

    net = caffe_pb2.NetParameter()
    text_format.Parse(train_text, net)
    out = caffe_pb2.NetParameter(name=net.name)
    data = out.layer.add(name="input", type="Input", top=["data"])
    data.input_param.shape.add(dim=[batch, 3, size, size])
    for layer in net.layer[1:]:
        new = out.layer.add()
        new.CopyFrom(layer)
        if layer.type == "BatchNorm":
            new.batch_norm_param.use_global_stats = False
        if layer.name == "res5c_relu":
            break
    return text_format.MessageToString(out)


def init_weights(net: Path, out: Path, size: int, batch: int = 16, seed: int = 7) -> None:
    """Random ResNet-50 weights for the layers train.py loads from ImageNet (module
    docstring), written with pycaffe's Net and ``net.save``."""
    import caffe2jax as caffe
    from caffe2jax.runtime.data.readers.roi_data import PIXEL_MEANS
    from examples.detection.synthetic_boxes import make_image

    rng = np.random.default_rng(seed)
    model = caffe.Net(str(net), caffe.TRAIN)
    for name, blobs in model.params.items():
        if model.layer_dict[name].type == "Scale":
            blobs[0].data[...], blobs[1].data[...] = 1.0, 0.0
        elif model.layer_dict[name].type != "BatchNorm" and not blobs[0].data.any():
            w = blobs[0].data  # no filler in the prototxt: one of ImageNet's layers
            w[...] = rng.normal(0, np.sqrt(2.0 / np.prod(w.shape[1:])), w.shape)
    stats_net = net.with_name("backbone_" + net.name)
    stats_net.write_text(backbone_text(net.read_text(), size, batch))
    stats = caffe.Net(str(stats_net), caffe.TRAIN)
    for name, blobs in stats.params.items():
        if stats.layer_dict[name].type != "BatchNorm":
            for mine, theirs in zip(blobs, model.params[name]):
                mine.data[...] = theirs.data
    images = [make_image(np.random.default_rng(seed + i), size)[0] for i in range(batch)]
    stats.blobs["data"].data[...] = np.stack(images) - PIXEL_MEANS[None, :, None, None]
    stats.forward()  # batch statistics; the BatchNorm blobs take them (moving average from 0)
    for name, blobs in stats.params.items():
        if stats.layer_dict[name].type == "BatchNorm":
            for mine, theirs in zip(model.params[name], blobs):
                mine.data[...] = theirs.data
    model.save(str(out))


def prepare(work: Path, size: int, count: int, max_iter: int, snapshot: int, lr: float = 0.001,
            stepsize: int = 80000) -> Path:  # fmt: skip
    """Data set, rewritten train prototxt, solver and random init weights in ``work``."""
    return prepare_work(
        work, size, count, lambda lmdb: train_prototxt(lmdb, size),
        lambda net, snap: solver_text(net, snap / "rfcn", max_iter, snapshot, lr, stepsize),
        lambda net, out: init_weights(net, out, size),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--iters", type=int, default=600)
    parser.add_argument("--snapshot", type=int, default=100)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--count", type=int, default=48)
    parser.add_argument("--lr", type=float, default=0.001, help="base_lr (the recipe's 0.001)")
    parser.add_argument("--stepsize", type=int, default=80000, help="the recipe's 80000")
    args = parser.parse_args()
    solver = prepare(args.work, args.size, args.count, args.iters, args.snapshot, args.lr,
                     args.stepsize)  # fmt: skip
    train_and_evaluate(args.work, solver, args.iters, args.size, "rfcn", train_only=TRAIN_ONLY)


if __name__ == "__main__":
    main()
