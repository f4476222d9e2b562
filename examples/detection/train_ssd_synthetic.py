#!/usr/bin/env python
"""Train MobileNet-SSD (chuanqi305's recipe, ../shared/forks/models) on the synthetic shapes
set of examples/detection/synthetic_boxes.py, through the CLI: ``caffe2jax train --solver ...``.

    python examples/detection/train_ssd_synthetic.py WORKDIR [--iters 2000] [--size 160] [--lr 0.01]
    python examples/detection/train_ssd_synthetic.py WORKDIR --size 96 --coverage  # priors only
    python examples/detection/train_ssd_synthetic.py WORKDIR --resume-check 250 500  # after a run
    python examples/detection/train_ssd_synthetic.py WORKDIR --small --lr 0.001 --test_interval 200

The fork's train and test prototxts are read where they are and rewritten in memory, changing
only data paths and sizes: the LMDB sources and label map, the batch sizes, the resize to
SIZE×SIZE, the class count (MultiBoxLoss/DetectionOutput/DetectionEvaluate ``num_classes``,
the ``*_mbox_conf`` convolutions' outputs, priors × classes, and the test net's confidence
Reshape), and the PriorBox
``min_size``/``max_size`` scaled by SIZE/300 so the priors cover the same share of the image
as at 300×300. The solver (written here) has SSD's ``multistep``, ``eval_type:
"detection"``, ``ap_version: "11point"`` and snapshots, with Adam (Caffe's) in place of the
recipe's SGD: the net trains from scratch here, with no ImageNet weights.

Why these defaults (measured, see docs/detection.md "MobileNet-SSD on the synthetic set"):

* SIZE 160, not smaller. The priors shrink with SIZE/300 but the feature maps' strides do
  not (16 for conv11, 32 for conv13, ...), so at 96 the 6×6 conv11 grid has 19-pixel priors
  16 pixels apart and only 43% of the test boxes have a prior with IoU > 0.5 (3.4 matched
  positives per image); at 160 87% (5.5), at 192 96% (7.4). ``--coverage`` prints these from
  the test net's own ``mbox_priorbox`` and ``label`` tops.
* base_lr 0.01. The recipe's ``lr_mult`` are fine-tuning ones: every backbone, extra-layer
  and ``*_mbox_loc`` parameter learns at 0.1 (biases 0.2) and only ``*_mbox_conf`` at 1, so
  at base_lr 0.001 the whole body and the box regression take Adam steps of 1e-4.
* The engines: ``ENGINES`` below, unless the environment sets them.

Everything goes under
WORKDIR; the mAP of each test (``detection_eval``) and the train losses are printed from the
log. ``--resume-check FROM`` (after a run) resumes from the snapshot of iteration FROM to the
next snapshot with ``--snapshot`` and checks that the weights and the losses logged are the
uninterrupted run's, byte for byte.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from google.protobuf import text_format

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT.parent / "shared" / "forks" / "models"
sys.path.insert(0, str(ROOT))

from caffe2jax.frontend import caffe_pb2  # noqa: E402

FORK_CLASSES = 21  # VOC's 20 + background in the fork's prototxts
# This net's training step is ~3x faster on the CPU with every convolution on oneDNN and the
# channels-last pass off than under the default policy (benchmarks/ssd_train.py); the
# environment's own values win.
ENGINES = {"CAFFE2JAX_CPU_CONV": "onednn-all", "CAFFE2JAX_CHANNELS_LAST": "0"}


def rewrite_net(path: Path, *, source: Path, batch: int, size: int, classes: int,
                label_map: Path) -> caffe_pb2.NetParameter:  # fmt: skip
    """The fork's net with only data paths and sizes changed (see the module doc)."""
    net = text_format.Parse(path.read_text(), caffe_pb2.NetParameter())
    factor = size / 300.0
    for layer in net.layer:
        if layer.type == "AnnotatedData":
            layer.data_param.source = str(source)
            layer.data_param.batch_size = batch
            layer.annotated_data_param.label_map_file = str(label_map)
            for resize in layer.transform_param.resize_param:
                resize.height = resize.width = size
        elif layer.type == "MultiBoxLoss":
            layer.multibox_loss_param.num_classes = classes
        elif layer.type == "DetectionOutput":
            layer.detection_output_param.num_classes = classes
        elif layer.type == "DetectionEvaluate":
            layer.detection_evaluate_param.num_classes = classes
        elif layer.type == "Convolution" and layer.name.endswith("_mbox_conf"):
            priors = layer.convolution_param.num_output // FORK_CLASSES
            layer.convolution_param.num_output = priors * classes
        elif layer.type == "Reshape" and list(layer.reshape_param.shape.dim[-1:]) == [21]:
            layer.reshape_param.shape.dim[-1] = classes  # the test net's (N, priors, classes)
        elif layer.type == "PriorBox":
            p = layer.prior_box_param
            p.min_size[:] = [v * factor for v in p.min_size]
            p.max_size[:] = [v * factor for v in p.max_size]
    return net


SOLVER = """train_net: "{train}"
test_net: "{test}"
test_iter: {test_iter}
test_interval: {test_interval}
test_initialization: false
base_lr: {lr}
lr_policy: "multistep"
gamma: 0.1
stepvalue: {step}
momentum: 0.9
weight_decay: 0.00005
type: "Adam"
momentum2: 0.999
delta: 1e-8
display: {display}
average_loss: 10
max_iter: {iters}
snapshot: {snapshot}
snapshot_prefix: "{prefix}"
solver_mode: CPU
random_seed: 1701
eval_type: "detection"
ap_version: "11point"
"""


def prepare(work: Path, args: argparse.Namespace) -> Path:
    """The data set, both nets and the solver under ``work``; returns the solver's path."""
    from examples.detection.synthetic_boxes import make_dataset

    data = work / "data"
    if not (data / "test_lmdb").exists():
        make_dataset(data, train=args.train, test=args.test, size=args.size)
    classes = 1 + 3
    for name, subset, batch in (("ssd_mobilenet_train", "train", args.batch),
                                ("ssd_mobilenet_voc_test", "test", args.test_batch)):  # fmt: skip
        net = rewrite_net(MODELS / f"{name}.prototxt", source=data / f"{subset}_lmdb",
                          batch=batch, size=args.size, classes=classes,
                          label_map=data / "labelmap.prototxt")  # fmt: skip
        (work / f"{subset}.prototxt").write_text(text_format.MessageToString(net))
    solver = work / "solver.prototxt"
    solver.write_text(SOLVER.format(
        train=work / "train.prototxt", test=work / "test.prototxt",
        test_iter=max(1, args.test // args.test_batch), test_interval=args.test_interval,
        lr=args.lr, step=int(args.iters * 0.75), display=args.display, iters=args.iters,
        snapshot=args.snapshot, prefix=work / "snap" / "ssd"))  # fmt: skip
    (work / "snap").mkdir(exist_ok=True)
    return solver


def prepare_small(work: Path, args: argparse.Namespace) -> Path:
    """``--small``: the CI test's small SSD (examples/detection/small_ssd.py: two stride-2
    convolutions of 32 channels, one PriorBox layer) on the same AnnotatedData recipe (mirror,
    emit CENTER, distort, expand, samplers, resize with interpolation modes), 48×48."""
    from examples.detection import small_ssd as small
    from examples.detection.synthetic_boxes import make_dataset

    files = make_dataset(work / "data", train=args.train, test=args.test,
                                           size=small.SIZE)  # fmt: skip
    common = {"size": small.SIZE, "labelmap": files["labelmap"]}
    train_net = small.DATA.format(phase="TRAIN", transform=small.TRAIN_AUG,
                                  interp="interp_mode: AREA", source=files["train_lmdb"],
                                  batch=args.batch, samplers=small.SAMPLERS, **common)  # fmt: skip
    test_net = small.DATA.format(phase="TEST", transform="", interp="", samplers="",
                                 source=files["test_lmdb"], batch=args.test_batch,
                                 **common)  # fmt: skip
    body = small.BODY.replace("num_output: 16", "num_output: 32")
    (work / "train.prototxt").write_text(train_net + body + small.LOSS)
    (work / "test.prototxt").write_text(test_net + body + small.EVAL)
    solver = work / "solver.prototxt"
    solver.write_text(SOLVER.format(
        train=work / "train.prototxt", test=work / "test.prototxt", test_iter=1,
        test_interval=args.test_interval, lr=args.lr, step=int(args.iters * 0.75),
        display=args.display, iters=args.iters, snapshot=args.snapshot,
        prefix=work / "snap" / "ssd"))  # fmt: skip
    (work / "snap").mkdir(exist_ok=True)
    return solver


def train(solver: Path, log: Path, *extra: str) -> float:
    """``caffe2jax train --solver SOLVER`` with its log in ``log``; returns the seconds."""
    start = time.time()
    cmd = [sys.executable, "-m", "caffe2jax", "train", "--solver", str(solver), "--log",
           str(log), "--force", "--progress", "log", *extra]  # fmt: skip
    env = dict(os.environ)
    for name, value in ENGINES.items():
        env.setdefault(name, value)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"train failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.time() - start


def curves(log: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(iteration, smoothed train loss) and (iteration, test mAP) from a Caffe-style log."""
    text = log.read_text()
    pattern = r"Iteration (\d+)(?: \([^)]*\))?, loss = ([-\d.e+nainf]+)"
    losses = [(int(i), float(v)) for i, v in re.findall(pattern, text)]
    maps, current = [], None
    for line in text.splitlines():
        hit = re.search(r"Iteration (\d+), Testing net", line)
        if hit:
            current = int(hit.group(1))
        hit = re.search(r"Test net output #\d+: detection_eval = ([-\d.e+]+)", line)
        if hit and current is not None:
            maps.append((current, float(hit.group(1))))
    return losses, maps


def raw_losses(log: Path) -> dict[int, float]:
    """iteration -> the unsmoothed ``Train net output #0`` loss logged after it."""
    out, current = {}, None
    for line in log.read_text().splitlines():
        hit = re.search(r"\] Iteration (\d+) \(", line)
        if hit:
            current = int(hit.group(1))
        hit = re.search(r"Train net output #0: \S+ = ([-\d.e+]+)", line)
        if hit and current is not None:
            out[current] = float(hit.group(1))
    return out


def resume_check(work: Path, start: int, end: int) -> None:
    """Resume from the snapshot of iteration ``start`` to ``end`` (another snapshot of the run
    in ``work``) into ``work/resume``; compare weights and logged losses with the run's."""
    folder = work / "resume"
    folder.mkdir(exist_ok=True)
    text = (work / "solver.prototxt").read_text()
    solver = folder / "solver.prototxt"
    solver.write_text(text.replace(str(work / "snap" / "ssd"), str(folder / "ssd")))
    seconds = train(solver, folder / "train.log", "--snapshot",
                    str(work / "snap" / f"ssd_iter_{start}.solverstate"),
                    "--iterations", str(end))  # fmt: skip
    whole, again = raw_losses(work / "train.log"), raw_losses(folder / "train.log")
    shared = sorted(set(whole) & set(again))
    same_losses = all(whole[i] == again[i] for i in shared)
    want = (work / "snap" / f"ssd_iter_{end}.caffemodel").read_bytes()
    same_weights = (folder / f"ssd_iter_{end}.caffemodel").read_bytes() == want
    print(f"resumed {start} -> {end} in {seconds:.0f} s: weights identical: {same_weights}; "
          f"losses logged at {shared[:3]}...{shared[-2:]} identical: {same_losses}")  # fmt: skip
    if not (same_weights and same_losses and shared):
        sys.exit("resume check FAILED")


def prior_coverage(work: Path) -> None:
    """``--coverage``: how well the test net's own priors (its ``mbox_priorbox`` top) cover the
    test set's boxes (its ``label`` top), as MultiBoxLoss matches them (``overlap_threshold``
    0.5; each box also takes its best prior, so a box has at least one positive)."""
    import caffe2jax as caffe
    from caffe2jax.runtime.outputs.boxes import iou as overlaps

    net = caffe.Net(str(work / "test.prototxt"), caffe.TEST)
    net.forward()
    priors = np.asarray(net.blobs["mbox_priorbox"].data)[0, 0].reshape(-1, 4)
    label = np.asarray(net.blobs["label"].data).reshape(-1, 8)
    boxes = label[label[:, 1] >= 0]
    iou = overlaps(boxes[:, 3:7], priors)
    best, images = iou.max(axis=1), len(set(boxes[:, 0].astype(int)))
    positives = np.maximum((iou > 0.5).sum(axis=1), 1).sum()
    maps = [tuple(net.blobs[n].data.shape[2:]) for n in net.blobs if n.endswith("_mbox_loc")]
    print(f"{len(priors)} priors from maps {maps}; {len(boxes)} boxes in {images} images: "
          f"median best IoU {np.median(best):.2f}, boxes with a prior over 0.5: "
          f"{(best > 0.5).mean():.0%}, positives per image {positives / images:.1f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    for name, default in (("iters", 2000), ("size", 160), ("batch", 8), ("test_batch", 32),
                          ("train", 64), ("test", 32), ("test_interval", 100),
                          ("snapshot", 500), ("display", 20)):  # fmt: skip
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--small", action="store_true", help="the CI test's small SSD instead")
    parser.add_argument("--coverage", action="store_true",
                        help="only print how the priors cover the test boxes")  # fmt: skip
    parser.add_argument("--resume-check", type=int, nargs=2, metavar=("FROM", "TO"),
                        help="only check a resume from snapshot FROM to snapshot TO")  # fmt: skip
    args = parser.parse_args()
    if args.resume_check:
        resume_check(args.work, *args.resume_check)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    solver = (prepare_small if args.small else prepare)(args.work, args)
    if args.coverage:
        prior_coverage(args.work)
        return
    seconds = train(solver, args.work / "train.log")
    losses, maps = curves(args.work / "train.log")
    print(f"{args.iters} iterations in {seconds:.0f} s ({seconds / args.iters:.2f} s/iter incl. "
          "tests and compilation)")  # fmt: skip
    print("| iteration | mAP (11point) |\n|---|---|")
    for it, value in maps:
        print(f"| {it} | {value:.4f} |")
    print("losses:", " ".join(f"{i}:{v:.3f}" for i, v in losses[:: max(1, len(losses) // 20)]))


if __name__ == "__main__":
    main()
