"""The box geometry of SSD's data pipeline (weiliu89/caffe util/bbox_util.cpp, util/sampler.cpp,
util/im_transforms.cpp), on normalized ``[xmin, ymin, xmax, ymax]`` float32 arrays.

* :func:`jaccard` / :func:`coverage`: ``JaccardOverlap`` and ``BBoxCoverage`` (normalized
  areas, no +1; a box with xmax < xmin or ymax < ymin has area 0; boxes that only touch
  intersect in an empty box; the overlap itself is the host's one, :mod:`caffe2jax.runtime.
  outputs.boxes`);
* :func:`project`: ``ProjectBBox`` (a box in the coordinates of a crop, clipped to [0, 1];
  kept when it overlaps the crop and its clipped area is positive);
* :func:`meet_emit`: ``MeetEmitConstraint`` (CENTER: the box's centre lies in the crop,
  bounds included; MIN_OVERLAP: the crop covers more than ``emit_overlap`` of the box);
* :func:`sample_box`, :func:`satisfies`, :func:`batch_samples`: ``SampleBBox`` (scale and
  aspect ratio uniform in their ranges, the ratio then clamped to [scale², 1/scale²] so the
  box fits, its corner uniform), ``SatisfySampleConstraint`` (see :func:`satisfies`) and
  ``GenerateBatchSamples`` (each sampler in turn: up to ``max_trials`` draws, stopping at
  ``max_sample`` kept; the draws of a sampler are made and checked as one array, and the
  generator left where the fork's one-at-a-time loop leaves it);
* :func:`resize_boxes`: ``UpdateBBoxByResizePolicy``, boxes through a resize_param.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.runtime.outputs.boxes import areas, intersections, iou

_F = np.float32
RP = caffe_pb2.ResizeParameter


def area(boxes: np.ndarray) -> np.ndarray:
    """``BBoxSize`` (normalized): 0 for an inverted box."""
    return areas(boxes).astype(_F)


def intersect(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``IntersectBBox`` of ``a`` (…, 4) with ``b`` (4,): [0, 0, 0, 0] where they are apart."""
    apart = (b[0] > a[..., 2]) | (b[2] < a[..., 0]) | (b[1] > a[..., 3]) | (b[3] < a[..., 1])
    inter = np.stack([np.maximum(a[..., 0], b[0]), np.maximum(a[..., 1], b[1]),
                      np.minimum(a[..., 2], b[2]), np.minimum(a[..., 3], b[3])], -1)  # fmt: skip
    return np.where(apart[..., None], _F(0), inter).astype(_F)


def jaccard(boxes: np.ndarray, box: np.ndarray) -> np.ndarray:
    """``JaccardOverlap`` of each of ``boxes`` (K, 4) with ``box`` (4,)."""
    return iou(boxes, box[None])[:, 0].astype(_F)


def coverage(boxes: np.ndarray, box: np.ndarray) -> np.ndarray:
    """``BBoxCoverage(boxes[k], box)``: the share of each of ``boxes`` that ``box`` covers."""
    size = area(intersect(boxes, box))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(size > 0, size / area(boxes), _F(0)).astype(_F)


def covered_by(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """``BBoxCoverage(box, boxes[k])``: the share of ``box`` that each of ``boxes`` covers."""
    sizes = area(np.stack([intersect(box[None], b)[0] for b in boxes])) if len(boxes) else (
        np.zeros(0, _F))  # fmt: skip
    box_area = area(box[None])[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sizes > 0, sizes / box_area, _F(0)).astype(_F)


def clip(boxes: np.ndarray) -> np.ndarray:
    """``ClipBBox``: every coordinate into [0, 1]."""
    return np.clip(boxes, _F(0), _F(1)).astype(_F)


def project(crop: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ProjectBBox`` of ``boxes`` (K, 4) into ``crop`` (4,): (kept mask, projected boxes)."""
    overlap = ~((boxes[:, 0] >= crop[2]) | (boxes[:, 2] <= crop[0])
                | (boxes[:, 1] >= crop[3]) | (boxes[:, 3] <= crop[1]))  # fmt: skip
    w, h = crop[2] - crop[0], crop[3] - crop[1]
    proj = np.stack([(boxes[:, 0] - crop[0]) / w, (boxes[:, 1] - crop[1]) / h,
                     (boxes[:, 2] - crop[0]) / w, (boxes[:, 3] - crop[1]) / h], -1)  # fmt: skip
    proj = clip(proj.reshape(-1, 4).astype(_F))
    return overlap & (area(proj) > 0), proj


def locate(source: np.ndarray, box: np.ndarray) -> np.ndarray:
    """``LocateBBox``: ``box`` given in the coordinates of ``source``, in the image's."""
    w, h = source[2] - source[0], source[3] - source[1]
    return np.array([source[0] + box[0] * w, source[1] + box[1] * h,
                     source[0] + box[2] * w, source[1] + box[3] * h], _F)  # fmt: skip


def meet_emit(crop: np.ndarray, boxes: np.ndarray, emit: caffe_pb2.EmitConstraint) -> np.ndarray:
    """``MeetEmitConstraint`` of each of ``boxes`` with the crop ``crop``: a mask."""
    if emit.emit_type == caffe_pb2.EmitConstraint.CENTER:
        cx = (boxes[:, 0] + boxes[:, 2]) / _F(2)
        cy = (boxes[:, 1] + boxes[:, 3]) / _F(2)
        return (cx >= crop[0]) & (cx <= crop[2]) & (cy >= crop[1]) & (cy <= crop[3])
    return coverage(boxes, crop) > _F(emit.emit_overlap)


def _draw(sampler: caffe_pb2.Sampler, u: np.ndarray) -> np.ndarray:
    """``SampleBBox`` for each row of ``u`` (T, 4), the uniforms its four ``caffe_rng_uniform``
    calls draw in turn (scale, aspect ratio, x offset, y offset): (T, 4) boxes in [0, 1]²,
    the same float64 values as numpy's ``uniform(low, high)`` calls give (``low + (high −
    low) · u``). The ratio is clamped to [scale², 1/scale²] so the box fits; at the clamp a
    side may pass 1 by rounding, and its offset is then 0."""
    scale = sampler.min_scale + (sampler.max_scale - sampler.min_scale) * u[:, 0]
    low, high = sampler.min_aspect_ratio, sampler.max_aspect_ratio
    ratio = np.minimum(np.maximum(low + (high - low) * u[:, 1], scale * scale),
                       1 / (scale * scale))  # fmt: skip
    width, height = scale * np.sqrt(ratio), scale / np.sqrt(ratio)
    w_off = np.maximum(0.0, 1 - width) * u[:, 2]
    h_off = np.maximum(0.0, 1 - height) * u[:, 3]
    return np.stack([w_off, h_off, w_off + width, h_off + height], -1)


def sample_box(sampler: caffe_pb2.Sampler, rng: np.random.Generator) -> tuple[float, ...]:
    """``SampleBBox``: one random box in [0, 1]² (four uniforms drawn from ``rng``)."""
    return tuple(float(v) for v in _draw(sampler, rng.random((1, 4)))[0])


def _measures(boxes: np.ndarray, objects: np.ndarray) -> dict[str, np.ndarray]:
    """(T, K) jaccard overlap, sample coverage and object coverage of each sample box with
    each object (float64, normalized)."""
    inter = intersections(boxes, objects)
    with np.errstate(divide="ignore", invalid="ignore"):
        sample = np.where(inter > 0, inter / areas(boxes)[:, None], 0.0)
        covered = np.where(inter > 0, inter / areas(objects)[None], 0.0)
    return {"jaccard_overlap": iou(boxes, objects), "sample_coverage": sample,
            "object_coverage": covered}  # fmt: skip


def satisfied(boxes: np.ndarray, objects: np.ndarray,
              constraint: caffe_pb2.SampleConstraint) -> np.ndarray:  # fmt: skip
    """:func:`satisfies` for each of ``boxes`` (T, 4): a (T,) mask."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    objects = np.asarray(objects, np.float64).reshape(-1, 4)
    has = constraint.HasField
    for name in ("jaccard_overlap", "sample_coverage", "object_coverage"):
        low, high = has(f"min_{name}"), has(f"max_{name}")
        if not (low or high):
            continue
        value = _measures(boxes, objects)[name]
        ok = np.ones(value.shape, bool)
        if low:
            ok &= value >= getattr(constraint, f"min_{name}")
        if high:
            ok &= value <= getattr(constraint, f"max_{name}")
        return ok.any(axis=1)
    return np.ones(len(boxes), bool)


def satisfies(box, objects, constraint: caffe_pb2.SampleConstraint) -> bool:
    """``SatisfySampleConstraint``: true when no bound is set, else when some object meets the
    bounds (min and/or max) of the first kind set, in the fork's order jaccard overlap, sample
    coverage, object coverage. With one kind (all of SSD's recipes) that is "some object meets
    every bound"; with several the fork's ``found`` flag outlives the object that set it, so a
    later kind's bounds never reject a sample, and that is reproduced here."""
    return bool(satisfied([box], objects, constraint)[0])


def _sampled(batch_sampler: caffe_pb2.BatchSampler, objects: np.ndarray,
             rng: np.random.Generator) -> list[np.ndarray]:  # fmt: skip
    """One sampler's kept boxes: its ``max_trials`` draws made at once, cut after the
    ``max_sample``-th kept one, and ``rng`` put back where the fork's loop leaves it (four
    uniforms per trial it made)."""
    limit = batch_sampler.max_sample if batch_sampler.HasField("max_sample") else None
    if limit == 0:
        return []
    start = rng.bit_generator.state
    boxes = _draw(batch_sampler.sampler, rng.random((batch_sampler.max_trials, 4)))
    hits = np.flatnonzero(satisfied(boxes, objects, batch_sampler.sample_constraint))
    if limit is not None and len(hits) >= limit:
        hits = hits[:limit]
        rng.bit_generator.state = start
        rng.random(4 * (int(hits[-1]) + 1))
    return [np.array(boxes[i], _F) for i in hits]


def batch_samples(samplers: Sequence[caffe_pb2.BatchSampler], objects: np.ndarray,
                  rng: np.random.Generator) -> list[np.ndarray]:  # fmt: skip
    """``GenerateBatchSamples``: the boxes every sampler kept, in sampler order (each
    ``LocateBBox``'d in the unit box, which leaves it as it is)."""
    kept: list[np.ndarray] = []
    objs = np.asarray(objects, np.float64).reshape(-1, 4)
    for batch_sampler in samplers:
        if batch_sampler.use_original_image:
            kept += _sampled(batch_sampler, objs, rng)
    return kept


def resize_boxes(param: caffe_pb2.ResizeParameter, width: int, height: int,
                 boxes: np.ndarray) -> np.ndarray:  # fmt: skip
    """``UpdateBBoxByResizePolicy``: boxes of a ``width``×``height`` image, normalized to the
    image ``param`` resizes it to (a padded resize moves them into the unpadded part)."""
    new_h, new_w = _F(param.height), _F(param.width)
    aspect = _F(width) / _F(height)
    x0, x1 = boxes[:, 0] * _F(width), boxes[:, 2] * _F(width)
    y0, y1 = boxes[:, 1] * _F(height), boxes[:, 3] * _F(height)
    mode = param.resize_mode

    def fit(lo, hi, new, old):
        return np.maximum(_F(0), lo * new / _F(old)), np.minimum(new, hi * new / _F(old))

    if mode == RP.FIT_LARGE_SIZE_AND_PAD and aspect > new_w / new_h:
        pad = (new_h - new_w / aspect) / _F(2)
        x0, x1 = fit(x0, x1, new_w, width)
        y0 = pad + np.maximum(_F(0), y0 * (new_h - 2 * pad) / _F(height))
        y1 = pad + np.minimum(new_h, y1 * (new_h - 2 * pad) / _F(height))
    elif mode == RP.FIT_LARGE_SIZE_AND_PAD:
        pad = (new_w - aspect * new_h) / _F(2)
        x0 = pad + np.maximum(_F(0), x0 * (new_w - 2 * pad) / _F(width))
        x1 = pad + np.minimum(new_w, x1 * (new_w - 2 * pad) / _F(width))
        y0, y1 = fit(y0, y1, new_h, height)
    else:
        if mode == RP.FIT_SMALL_SIZE and aspect < new_w / new_h:
            new_h = new_w / aspect
        elif mode == RP.FIT_SMALL_SIZE:
            new_w = aspect * new_h
        x0, x1 = fit(x0, x1, new_w, width)
        y0, y1 = fit(y0, y1, new_h, height)
    return np.stack([x0 / new_w, y0 / new_h, x1 / new_w, y1 / new_h], -1).astype(_F)
