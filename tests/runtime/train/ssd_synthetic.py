"""A Python data layer of synthetic detection scenes for the SSD tests and benchmark: each
32×32 image holds one or two squares (8–14 px) on a noisy dark background, class 1 red and
class 2 green; the label blob is (1, 1, 2·batch, 8) rows [item, label, instance, xmin, ymin,
xmax, ymax, difficult] normalized, padded with all −1 rows (caffe2jax's AnnotatedData
contract)."""

from __future__ import annotations

import numpy as np

import caffe2jax as caffe

SIZE = 32


def scene(rng: np.random.Generator) -> tuple[np.ndarray, list[list[float]]]:
    """One image (3, SIZE, SIZE) and its boxes [label, xmin, ymin, xmax, ymax] (normalized)."""
    image = rng.uniform(0, 0.15, (3, SIZE, SIZE)).astype(np.float32)
    boxes: list[list[float]] = []
    for _ in range(rng.integers(1, 3)):
        for _ in range(20):  # a spot that does not overlap the first square
            side = int(rng.integers(8, 15))
            x0, y0 = (int(v) for v in rng.integers(0, SIZE - side, 2))
            if all(x0 >= b[3] * SIZE or x0 + side <= b[1] * SIZE or y0 >= b[4] * SIZE
                   or y0 + side <= b[2] * SIZE for b in boxes):  # fmt: skip
                break
        else:
            continue
        label = int(rng.integers(1, 3))
        image[label - 1, y0 : y0 + side, x0 : x0 + side] = 1.0
        boxes.append([label, x0 / SIZE, y0 / SIZE, (x0 + side) / SIZE, (y0 + side) / SIZE])
    return image, boxes


def batch(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(data (n, 3, SIZE, SIZE), label (1, 1, 2n, 8)) with the padding rows last."""
    images, rows = [], []
    for i in range(n):
        image, boxes = scene(rng)
        images.append(image)
        rows += [[i, b[0], k, *b[1:], 0] for k, b in enumerate(boxes)]
    rows += [[-1] * 8] * (2 * n - len(rows))
    return np.stack(images), np.asarray(rows, np.float32).reshape(1, 1, 2 * n, 8)


class Scenes(caffe.Layer):
    """Tops data and label; ``param_str``: "batch seed"."""

    def setup(self, bottom, top):
        n, seed = (int(v) for v in self.param_str.split())
        self.n, self.rng = n, np.random.default_rng(seed)

    def reshape(self, bottom, top):
        top[0].reshape(self.n, 3, SIZE, SIZE)
        top[1].reshape(1, 1, 2 * self.n, 8)

    def forward(self, bottom, top):
        data, label = batch(self.rng, self.n)
        top[0].data[...] = data
        top[1].data[...] = label
