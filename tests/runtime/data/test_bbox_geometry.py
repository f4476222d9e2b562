"""SSD's box geometry (runtime/data/transform/bbox_geometry.py): overlaps against hand-worked
cases, and the batch samplers' constraints over many draws."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from caffe2jax.frontend import caffe_pb2
from caffe2jax.runtime.data.transform.bbox_geometry import (
    batch_samples,
    coverage,
    covered_by,
    jaccard,
    meet_emit,
    project,
    resize_boxes,
    satisfies,
)

B = np.array


def test_overlaps_by_hand():
    boxes = B([[0, 0, 0.5, 0.5], [0.25, 0.25, 0.75, 0.75], [0.6, 0.6, 1, 1], [0.5, 0, 1, 0.5]],
              np.float32)  # fmt: skip
    box = B([0, 0, 0.5, 0.5], np.float32)
    # IoU: itself 1; a quarter-overlap 0.0625 / (0.25 + 0.25 - 0.0625); apart 0; touching 0
    np.testing.assert_allclose(jaccard(boxes, box), [1, 0.0625 / 0.4375, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(coverage(boxes, box), [1, 0.25, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(covered_by(box, boxes), [1, 0.25, 0, 0], rtol=1e-6)
    keep, proj = project(B([0.25, 0.25, 0.75, 0.75], np.float32), boxes)
    assert keep.tolist() == [True, True, True, True]
    np.testing.assert_allclose(proj, [[0, 0, 0.5, 0.5], [0, 0, 1, 1], [0.7, 0.7, 1, 1],
                                      [0.5, 0, 1, 0.5]], atol=1e-6)  # fmt: skip
    keep, _ = project(B([0.25, 0.25, 0.5, 0.5], np.float32), boxes[2:])
    assert keep.tolist() == [False, False]  # apart; touching the crop's edge only


def test_emit_center_and_min_overlap():
    crop = B([0.2, 0.2, 0.6, 0.6], np.float32)
    boxes = B([[0.1, 0.1, 0.3, 0.3], [0.5, 0.5, 0.9, 0.9], [0, 0, 0.38, 0.38], [0.61, 0, 1, 1]],
              np.float32)  # fmt: skip
    center = caffe_pb2.EmitConstraint(emit_type=caffe_pb2.EmitConstraint.CENTER)
    assert meet_emit(crop, boxes, center).tolist() == [True, False, False, False]
    overlap = caffe_pb2.EmitConstraint(emit_type=caffe_pb2.EmitConstraint.MIN_OVERLAP,
                                       emit_overlap=0.2)  # fmt: skip
    # covered shares 0.25, 0.0625, (0.18/0.38)^2 = 0.224, 0
    assert meet_emit(crop, boxes, overlap).tolist() == [True, False, True, False]


SSD_SAMPLERS = """
batch_sampler { max_sample: 1 max_trials: 1 }
batch_sampler { sampler { min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 max_aspect_ratio: 2 }
  sample_constraint { min_jaccard_overlap: 0.1 } max_sample: 1 max_trials: 50 }
batch_sampler { sampler { min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 max_aspect_ratio: 2 }
  sample_constraint { min_jaccard_overlap: 0.7 } max_sample: 1 max_trials: 50 }
batch_sampler { sampler { min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 max_aspect_ratio: 2 }
  sample_constraint { max_jaccard_overlap: 1.0 } max_sample: 1 max_trials: 50 }
batch_sampler { sampler { min_scale: 0.2 max_scale: 0.6 min_aspect_ratio: 0.3 max_aspect_ratio: 3 }
  sample_constraint { min_sample_coverage: 0.3 max_sample_coverage: 0.9 } max_sample: 2
  max_trials: 50 }
batch_sampler { sampler { min_scale: 0.5 max_scale: 0.9 min_aspect_ratio: 1 max_aspect_ratio: 1 }
  sample_constraint { min_object_coverage: 0.5 } max_sample: 1 max_trials: 50 }
"""


def _samplers() -> list[caffe_pb2.BatchSampler]:
    return list(text_format.Parse(SSD_SAMPLERS, caffe_pb2.AnnotatedDataParameter()).batch_sampler)


def test_sampler_constraints_hold_over_2000_draws():
    samplers = _samplers()
    rng = np.random.default_rng(0)
    counts = np.zeros(len(samplers), int)
    for _ in range(2000):
        centres = rng.uniform(0.1, 0.9, (3, 2))
        sizes = rng.uniform(0.05, 0.5, (3, 2))
        objects = np.clip(np.concatenate([centres - sizes / 2, centres + sizes / 2], 1), 0, 1)
        objects = objects.astype(np.float32)
        for index, sampler in enumerate(samplers):
            for box in batch_samples([sampler], objects, rng):
                counts[index] += 1
                _check(box, sampler, objects)
    # every sampler keeps samples (the hardest, IoU >= 0.7, rarely), each at most max_sample
    assert (counts > 0).all() and counts[0] == 2000 and counts[4] <= 4000


def _check(box: np.ndarray, sampler: caffe_pb2.BatchSampler, objects: np.ndarray) -> None:
    s, c = sampler.sampler, sampler.sample_constraint
    w, h = box[2] - box[0], box[3] - box[1]
    eps = 1e-5
    assert (box >= -eps).all() and (box <= 1 + eps).all()
    scale = np.sqrt(w * h)
    assert s.min_scale - eps <= scale <= s.max_scale + eps
    lo, hi = max(s.min_aspect_ratio, scale**2), min(s.max_aspect_ratio, 1 / scale**2)
    assert lo * (1 - 1e-4) <= w / h <= hi * (1 + 1e-4)
    if c.HasField("min_jaccard_overlap"):
        assert jaccard(objects, box).max() >= c.min_jaccard_overlap
    if c.HasField("max_jaccard_overlap"):
        assert jaccard(objects, box).min() <= c.max_jaccard_overlap
    if c.HasField("min_sample_coverage"):
        share = covered_by(box, objects)
        assert ((share >= c.min_sample_coverage) & (share <= c.max_sample_coverage)).any()
    if c.HasField("min_object_coverage"):
        assert coverage(objects, box).max() >= c.min_object_coverage


def test_the_first_kind_of_bound_decides_as_in_the_fork():
    # object 0 meets the jaccard bound but not the coverage one: the fork still accepts
    objects = B([[0, 0, 0.5, 0.5]], np.float32)
    box = B([0, 0, 0.5, 0.6], np.float32)
    both = caffe_pb2.SampleConstraint(min_jaccard_overlap=0.5, min_object_coverage=1.1)
    assert satisfies(box, objects, both)
    assert not satisfies(box, objects, caffe_pb2.SampleConstraint(min_object_coverage=1.1))
    assert satisfies(box, objects, caffe_pb2.SampleConstraint())


@pytest.mark.parametrize("mode, want", [
    ("WARP", [0.25, 0.25, 0.5, 1.0]),
    # 200×100 into 100×100: scaled to 100×50, padded 25 rows above and below
    ("FIT_LARGE_SIZE_AND_PAD", [0.25, 0.25 + 0.125, 0.5, 0.75]),
    ("FIT_SMALL_SIZE", [0.25, 0.25, 0.5, 1.0]),
])  # fmt: skip
def test_resize_policies(mode, want):
    param = text_format.Parse(f"resize_mode: {mode} height: 100 width: 100",
                              caffe_pb2.ResizeParameter())  # fmt: skip
    got = resize_boxes(param, 200, 100, B([[0.25, 0.25, 0.5, 1.0]], np.float32))
    np.testing.assert_allclose(got[0], want, atol=1e-6)
