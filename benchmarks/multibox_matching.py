"""MultiBoxLoss's matching cost against the box count (issue 37): one jitted forward +
backward of SSD300's loss (8,732 priors, 21 classes, batch 8) whose first image holds K boxes
and the others 3 each, the label padded to the batch's rows. Prints ms per call for each K, so
runs before and after a change (or on two machines) compare directly; the ratio of two K's
shows the growth (linear in boxes × priors: 5× the boxes ≈ 5× the time, or less).

``--huge K --epoch E``: the per-step cost of one K-box record among 3-box records, an epoch
of E batches of which one holds it, before and after AnnotatedData's label buckets (same run,
same inputs): before, every batch's label was padded to the worst batch's rows (G = K + 21);
now a batch of 3-box images is padded to its own bucket (32 rows) and only the huge record's
batch pays G. Loss and gradients are the same bits either way
(tests/runtime/train/test_step.py).

    python benchmarks/multibox_matching.py [--boxes 300,1500,5000] [--priors 8732]
    python benchmarks/multibox_matching.py --huge 5000 --epoch 100
"""

from __future__ import annotations

import argparse
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.lowering.model import compile as compile_net
from caffe2jax.runtime.data.readers.annotated_data import bucket_rows

CLASSES, BATCH = 21, 8


def _boxes(rng: np.random.Generator, count: int) -> np.ndarray:
    """Random boxes inside [0, 1]: centres uniform, sides 0.02–0.4."""
    centre = rng.uniform(0.05, 0.95, (count, 2))
    side = rng.uniform(0.02, 0.4, (count, 2))
    return np.clip(np.concatenate([centre - side / 2, centre + side / 2], 1), 0, 1)


def inputs(boxes: int, priors: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    counts = [boxes] + [3] * (BATCH - 1)
    rows = []
    for item, n in enumerate(counts):
        for k, box in enumerate(_boxes(rng, n)):
            rows.append([item, rng.integers(1, CLASSES), k, *box, 0])
    prior = np.stack([_boxes(rng, priors), np.tile([0.1, 0.1, 0.2, 0.2], (priors, 1))])
    return {
        "loc": rng.standard_normal((BATCH, priors * 4)).astype(np.float32) * 0.5,
        "conf": rng.standard_normal((BATCH, priors * CLASSES)).astype(np.float32),
        "prior": prior.reshape(1, 2, -1).astype(np.float32),
        "label": np.asarray(rows, np.float32).reshape(1, 1, -1, 8),
    }


def net(feed: dict[str, np.ndarray]) -> str:
    tops = "".join(f'top: "{k}" ' for k in feed)
    shapes = "".join("shape { " + " ".join(f"dim: {d}" for d in v.shape) + " } "
                     for v in feed.values())  # fmt: skip
    return (
        f'layer {{ name: "input" type: "Input" {tops} input_param {{ {shapes} }} }}\n'
        'layer { name: "mbox" type: "MultiBoxLoss" bottom: "loc" bottom: "conf" '
        'bottom: "prior" bottom: "label" top: "loss" propagate_down: true '
        "propagate_down: true propagate_down: false propagate_down: false "
        f"multibox_loss_param {{ num_classes: {CLASSES} }} }}\n"
    )


def padded(feed: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """``feed`` with its label padded by -1 rows to ``rows``."""
    label = feed["label"]
    pad = np.full((1, 1, rows - label.shape[2], 8), -1, np.float32)
    return {**feed, "label": np.concatenate([label, pad], axis=2)}


def time_one(boxes: int, priors: int, repeats: int, rows: int | None = None) -> tuple[float, float]:
    """(compile s, median ms per forward + backward), the label padded to ``rows``."""
    feed = inputs(boxes, priors)
    feed = feed if rows is None else padded(feed, rows)
    model = compile_net(net(feed), phase="TRAIN")
    params, state = model.init(0)

    def loss(x, rest):  # every input an argument, as the train step feeds them
        return model.apply(params, state, {**rest, **x})[0]["loss"]

    step = jax.jit(jax.value_and_grad(loss))
    x = {"loc": jnp.asarray(feed["loc"]), "conf": jnp.asarray(feed["conf"])}
    rest = {k: jnp.asarray(feed[k]) for k in ("prior", "label")}
    start = time.perf_counter()
    jax.block_until_ready(step(x, rest))
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(step(x, rest))
        times.append(time.perf_counter() - start)
    return compile_s, 1000 * float(np.median(times))


def huge_among_small(huge: int, epoch: int, priors: int, repeats: int) -> None:
    """The ``--huge`` table: ms per step of a small batch and of the huge record's batch,
    label rows before (worst padding) and after (buckets), and the mean over an epoch."""
    worst = huge + 3 * (BATCH - 1)
    small = 3 * BATCH
    bucket = bucket_rows(small, worst)
    big_ms = time_one(huge, priors, repeats, worst)[1]
    before_ms = time_one(3, priors, repeats, worst)[1]
    after_ms = time_one(3, priors, repeats, bucket)[1]
    print("| batch | label rows before | after | ms before | ms after |")
    print("|---|---|---|---|---|")
    print(f"| {BATCH} images × 3 boxes | {worst} | {bucket} | {before_ms:.0f} | {after_ms:.0f} |")
    print(f"| the {huge}-box record's | {worst} | {worst} | {big_ms:.0f} | {big_ms:.0f} |")
    mean_before = (big_ms + (epoch - 1) * before_ms) / epoch
    mean_after = (big_ms + (epoch - 1) * after_ms) / epoch
    print(
        f"\nmean ms per step over an epoch of {epoch} batches (one holds the huge record): "
        f"before {mean_before:.0f}, after {mean_after:.0f} ({mean_before / mean_after:.1f}×)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boxes", default="300,1500,5000")
    parser.add_argument("--priors", type=int, default=8732)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--huge", type=int, default=0, help="the --huge table (see above)")
    parser.add_argument("--epoch", type=int, default=100)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {jax.devices()[0].platform}, "
          f"jax {jax.__version__}; priors {args.priors}, batch {BATCH}")  # fmt: skip
    if args.huge:
        huge_among_small(args.huge, args.epoch, args.priors, args.repeats)
        return
    print("| boxes in image 0 | label rows | compile s | ms per forward+backward |")
    print("|---|---|---|---|")
    for k in (int(v) for v in args.boxes.split(",")):
        compile_s, ms = time_one(k, args.priors, args.repeats)
        print(f"| {k} | {k + 3 * (BATCH - 1)} | {compile_s:.1f} | {ms:.0f} |", flush=True)


if __name__ == "__main__":
    main()
