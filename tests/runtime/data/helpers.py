"""Shared helpers of the data-pipeline tests: layers from prototxt text, tiny databases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from google.protobuf import text_format

from caffe2jax.frontend import caffe_pb2
from caffe2jax.runtime.data.records.datum import array_to_datum
from caffe2jax.runtime.data.records.db import Writer


def layer(text: str) -> caffe_pb2.LayerParameter:
    """A LayerParameter from prototxt text."""
    return text_format.Parse(text, caffe_pb2.LayerParameter())


def transform_param(text: str = "") -> caffe_pb2.TransformationParameter:
    return text_format.Parse(text, caffe_pb2.TransformationParameter())


def write_db(path: Path, items: list[np.ndarray], labels: list[int], backend: str = "lmdb") -> Path:
    """A database of raw/float Datums keyed like convert_imageset ("%08d_item<i>")."""
    with Writer(path, backend) as writer:
        for i, (item, label) in enumerate(zip(items, labels, strict=True)):
            writer.put(f"{i:08d}_item{i}", array_to_datum(item, label).SerializeToString())
    return path


def numbered_items(count: int, shape: tuple[int, int, int] = (1, 2, 2)) -> list[np.ndarray]:
    """uint8 items whose every pixel is the item's index, so batches show the read order."""
    return [np.full(shape, i, np.uint8) for i in range(count)]


def data_layer(source: Path, batch: int, extra: str = "", transform: str = "") -> str:
    """Prototxt of a Data layer over an LMDB."""
    return (
        f'name: "d" type: "Data" top: "data" top: "label" transform_param {{ {transform} }} '
        f'data_param {{ source: "{source}" batch_size: {batch} backend: LMDB {extra} }}'
    )


def write_annotated_db(path: Path, counts: list[int], size: int = 8, seed: int = 0) -> Path:
    """An LMDB of BBOX AnnotatedDatum records, record ``i`` holding ``counts[i]`` random boxes
    (labels 1–3, inside [0, 1]) on a random uint8 size×size image."""
    from caffe2jax.runtime.data.records.annotated_datum import Boxes, annotated_datum

    rng = np.random.default_rng(seed)
    with Writer(path) as writer:
        for i, count in enumerate(counts):
            image = rng.integers(0, 256, (3, size, size), dtype=np.uint8)
            centre = rng.uniform(0.2, 0.8, (count, 2))
            side = rng.uniform(0.1, 0.4, (count, 2))
            boxes = np.clip(np.concatenate([centre - side / 2, centre + side / 2], 1), 0, 1)
            record = annotated_datum(array_to_datum(image),
                                     Boxes.of(boxes, rng.integers(1, 4, count)))  # fmt: skip
            writer.put(f"{i:08d}", record.SerializeToString())
    return path
