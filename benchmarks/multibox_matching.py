"""MultiBoxLoss's matching cost against the box count (issue 37): one jitted forward +
backward of SSD300's loss (8,732 priors, 21 classes, batch 8) whose first image holds K boxes
and the others 3 each, the label padded to the batch's rows. Prints ms per call for each K, so
runs before and after a change (or on two machines) compare directly; the ratio of two K's
shows the growth (linear in boxes × priors: 5× the boxes ≈ 5× the time, or less).

    python benchmarks/multibox_matching.py [--boxes 300,1500,5000] [--priors 8732]
"""

from __future__ import annotations

import argparse
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.lowering.model import compile as compile_net

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


def time_one(boxes: int, priors: int, repeats: int) -> tuple[float, float]:
    """(compile s, median ms per forward + backward)."""
    feed = inputs(boxes, priors)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boxes", default="300,1500,5000")
    parser.add_argument("--priors", type=int, default=8732)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {jax.devices()[0].platform}, "
          f"jax {jax.__version__}; priors {args.priors}, batch {BATCH}")  # fmt: skip
    print("| boxes in image 0 | label rows | compile s | ms per forward+backward |")
    print("|---|---|---|---|")
    for k in (int(v) for v in args.boxes.split(",")):
        compile_s, ms = time_one(k, args.priors, args.repeats)
        print(f"| {k} | {k + 3 * (BATCH - 1)} | {compile_s:.1f} | {ms:.0f} |", flush=True)


if __name__ == "__main__":
    main()
