"""The forks' pair lists (runtime/data/readers/pair_list.py): parsing, the list walk shared by
DenseImageData, ImageSegData and VideoData (shuffle at each wrap-around, rand_skip) and
skipping batches undecoded (other processes' batches) to the exact state reading them leaves."""

from __future__ import annotations

import numpy as np
import pytest

from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.base import plain
from caffe2jax.runtime.data.readers.pair_list import Pair, parse_pair_list
from caffe2jax.runtime.data.sources import make_source

from .test_dense_image_data import dense, write_pairs
from .test_video_data import video, write_videos


def test_parse_pairs_and_image_only_lines(tmp_path):
    path = tmp_path / "l.txt"
    path.write_text("a.png a_l.png\n\n  b.png\tb_l.png  \n")
    assert parse_pair_list(path) == [Pair("a.png", "a_l.png", 1), Pair("b.png", "b_l.png", 3)]
    path.write_text("a.png\nb.png ignored\n")  # label_type NONE reads the image token only
    assert [p.image for p in parse_pair_list(path, tokens=1)] == ["a.png", "b.png"]
    path.write_text("\n")
    with pytest.raises(DataError, match="l.txt: list file is empty"):
        parse_pair_list(path)
    with pytest.raises(DataError, match="cannot read list file"):
        parse_pair_list(tmp_path / "missing.txt")


def test_shuffle_reshuffles_at_each_wrap_around_and_rand_skip(tmp_path):
    images, _ = write_pairs(tmp_path, count=4)
    source = make_source(dense(tmp_path, 4, "shuffle: true"), "TRAIN", seed=1)
    firsts = []
    for _ in range(6):
        data = source.next_batch()[0]
        order = [next(i for i in range(4) if np.array_equal(row, images[i])) for row in data]
        assert sorted(order) == [0, 1, 2, 3]  # each epoch is one permutation of the list
        firsts.append(tuple(order))
    assert len(set(firsts)) > 1  # reshuffled at the wrap-arounds
    starts = set()
    for seed in range(20):
        data = make_source(dense(tmp_path, 1, "rand_skip: 3"), "TRAIN", seed=seed).next_batch()
        starts.add(next(i for i in range(4) if np.array_equal(data[0][0], images[i])))
    assert starts == {0, 1, 2}  # Rand(rand_skip) lines skipped once


@pytest.mark.parametrize("kind", ["DenseImageData", "VideoData"])
def test_skip_moves_exactly_as_reading_would(tmp_path, kind):
    if kind == "DenseImageData":
        write_pairs(tmp_path, count=3)
        text = dense(tmp_path, 2, "shuffle: true mirror: true crop_height: 4 crop_width: 5")
    else:
        write_videos(tmp_path, count=3)
        text = video(tmp_path, ["v0 1 0", "v1 2 1", "v2 3 2"], 2, "shuffle: true",
                     "crop_size: 4 mirror: true")  # fmt: skip
    read = make_source(text, "TRAIN", seed=5)
    for _ in range(3):
        read.next_batch()
    skipped = make_source(text, "TRAIN", seed=5)
    skipped.skip(3)
    assert plain(skipped.get_state()) == plain(read.get_state())
    for got, want in zip(skipped.next_batch(), read.next_batch(), strict=True):
        assert got.tobytes() == want.tobytes()
