"""SSD's AnnotatedData transform (runtime/data/transform/annotated.py): boxes stay on their
pixels through expand, crop, resize and mirror; emit_constraint CENTER keeps exactly the
boxes whose centre lies in the crop; resize modes' shapes; one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.records.annotated_datum import Boxes
from caffe2jax.runtime.data.transform.annotated import AnnotatedTransformer, Recipe

from .helpers import transform_param

MARK = 200  # the object's value in every channel; the background is below 100


def transformer(text: str, samplers: str = "", phase: str = "TRAIN") -> AnnotatedTransformer:
    batch = text_format.Parse(samplers, caffe_pb2.AnnotatedDataParameter()).batch_sampler
    return AnnotatedTransformer(transform_param(text), phase, list(batch), "layer 'a'")


def scene(h=40, w=60, box=(12, 8, 30, 20)):
    """An image with one marked rectangle (x0, y0, x1, y1 in pixels, max exclusive)."""
    rng = np.random.default_rng(1)
    image = rng.integers(0, 100, (3, h, w), dtype=np.uint8)
    x0, y0, x1, y1 = box
    image[:, y0:y1, x0:x1] = MARK
    return image, Boxes.of([[x0 / w, y0 / h, x1 / w, y1 / h]], [1])


def run(t: AnnotatedTransformer, image, boxes, seed, out_shape=None):
    recipe, kept = t.plan(np.random.default_rng(seed), image.shape, boxes, encoded=True)
    if out_shape is None:
        h, w = image.shape[1:]
        if recipe.expand is not None:
            h, w = recipe.expand[:2]
        if recipe.crop is not None:
            h, w = recipe.crop[2:]
        out_shape = (image.shape[0], h, w)
    out = np.empty(out_shape, np.float32)
    t.apply(image, recipe, out)
    return recipe, kept, out


def marked_box(out: np.ndarray) -> tuple[float, ...]:
    ys, xs = np.nonzero(out[0] == MARK)
    h, w = out.shape[1:]
    return xs.min() / w, ys.min() / h, (xs.max() + 1) / w, (ys.max() + 1) / h


def test_expand_keeps_boxes_on_the_same_pixels_and_fills_with_the_mean():
    t = transformer("mean_value: 30 mean_value: 40 mean_value: 50 "
                    "expand_param { prob: 1 max_expand_ratio: 3 }")  # fmt: skip
    image, boxes = scene()
    for seed in range(20):
        recipe, kept, out = run(t, image, boxes, seed)
        assert recipe.expand is not None
        out += np.array([30, 40, 50], np.float32)[:, None, None]  # undo the mean
        np.testing.assert_allclose(kept.boxes[0], marked_box(out), atol=1e-5)
        big_h, big_w, h_off, w_off = recipe.expand
        assert out[:, 0, 0].tolist() in ([30, 40, 50], list(image[:, 0, 0])) or h_off == 0


def test_mirror_flips_boxes_as_one_minus_x_with_the_pixels():
    t = transformer("mirror: true")
    image, boxes = scene()
    flips = 0
    for seed in range(20):
        recipe, kept, out = run(t, image, boxes, seed)
        b = boxes.boxes[0]
        want = [1 - b[2], b[1], 1 - b[0], b[3]] if recipe.mirror else b
        np.testing.assert_allclose(kept.boxes[0], want, atol=1e-6)
        np.testing.assert_allclose(kept.boxes[0], marked_box(out), atol=1e-6)
        flips += recipe.mirror
    assert 0 < flips < 20


def test_sampled_crops_with_emit_center_keep_exactly_the_centred_boxes():
    samplers = ("batch_sampler { sampler { min_scale: 0.3 max_scale: 0.8 min_aspect_ratio: 0.5 "
                "max_aspect_ratio: 2 } max_sample: 1 max_trials: 1 }")  # fmt: skip
    t = transformer("emit_constraint { emit_type: CENTER }", samplers)
    rng = np.random.default_rng(5)
    for _ in range(300):
        centres, sizes = rng.uniform(0, 1, (6, 2)), rng.uniform(0.05, 0.4, (6, 2))
        raw = np.concatenate([centres - sizes / 2, centres + sizes / 2], 1).astype(np.float32)
        boxes = Boxes.of(np.clip(raw, 0, 1), np.arange(6))
        crop = np.array(next(iter([_crop(rng, t)])), np.float32)
        kept = t._annotate(boxes, crop)
        cx, cy = (
            (boxes.boxes[:, 0] + boxes.boxes[:, 2]) / 2,
            (boxes.boxes[:, 1] + boxes.boxes[:, 3]) / 2,
        )
        inside = (cx >= crop[0]) & (cx <= crop[2]) & (cy >= crop[1]) & (cy <= crop[3])
        assert kept.labels.tolist() == np.flatnonzero(inside).tolist()
        w, h = crop[2] - crop[0], crop[3] - crop[1]
        want = (boxes.boxes[inside] - crop[[0, 1, 0, 1]]) / np.array([w, h, w, h], np.float32)
        np.testing.assert_allclose(kept.boxes, np.clip(want, 0, 1), atol=1e-5)


def _crop(rng, t):
    from caffe2jax.runtime.data.transform.bbox_geometry import sample_box

    return sample_box(t.samplers[0].sampler, rng)


def test_sampled_crop_keeps_boxes_on_their_pixels():
    samplers = ("batch_sampler { sampler { min_scale: 0.5 max_scale: 1 } sample_constraint { "
                "min_object_coverage: 1 } max_trials: 50 max_sample: 1 }")  # fmt: skip
    t = transformer("", samplers)
    image, boxes = scene(80, 80, (30, 30, 50, 50))
    for seed in range(15):
        recipe, kept, out = run(t, image, boxes, seed)
        assert recipe.crop is not None and len(kept) == 1
        # the fork truncates the crop to whole pixels but projects by the exact box: ±1.5 px
        np.testing.assert_allclose(kept.boxes[0], marked_box(out), atol=1.5 / out.shape[1])


@pytest.mark.parametrize("mode, size, want", [
    ("WARP", (40, 60), (3, 30, 50)),
    ("FIT_LARGE_SIZE_AND_PAD", (40, 60), (3, 30, 50)),
    ("FIT_SMALL_SIZE", (40, 60), (3, 33, 50)),  # int(50 / 1.5) rows
    ("FIT_SMALL_SIZE", (60, 40), (3, 75, 50)),
])  # fmt: skip
def test_resize_modes_give_the_forks_shapes(mode, size, want):
    t = transformer(f"resize_param {{ resize_mode: {mode} height: 30 width: 50 "
                    "interp_mode: LINEAR interp_mode: AREA interp_mode: NEAREST interp_mode: CUBIC "
                    "interp_mode: LANCZOS4 pad_value: 7 }")  # fmt: skip
    assert t.output_shape(3, *size) == want
    image, boxes = scene(*size, box=(4, 4, 20, 20))
    modes = set()
    for seed in range(30):
        recipe, kept, out = run(t, image, boxes, seed, out_shape=want)
        modes.add(recipe.interp)
        if recipe.interp == 0:  # NEAREST: no blending, the marked box is exact
            np.testing.assert_allclose(
                kept.boxes[0], marked_box(out), atol=1.01 / min(out.shape[1:])
            )
    assert len(modes) == 5  # the fork picks one of the listed modes at random
    if mode == "FIT_LARGE_SIZE_AND_PAD":  # 60×40 into 50×30: scaled to 45×30, 2 | 3 pad columns
        assert (out[:, :, :2] == 7).all() and (out[:, :, -3:] == 7).all()


def test_distort_changes_pixels_not_boxes_and_only_encoded_records():
    t = transformer("distort_param { brightness_prob: 1 brightness_delta: 32 contrast_prob: 1 "
                    "contrast_lower: 0.5 contrast_upper: 1.5 hue_prob: 1 hue_delta: 18 "
                    "saturation_prob: 1 saturation_lower: 0.5 saturation_upper: 1.5 "
                    "random_order_prob: 1 }")  # fmt: skip
    image, boxes = scene()
    recipe, kept, out = run(t, image, boxes, 3)
    assert [name for name, _ in recipe.distort] in (
        ["brightness", "contrast", "saturation", "hue"],
        ["brightness", "saturation", "hue", "contrast"])  # fmt: skip
    assert sorted(recipe.channels) == [0, 1, 2]
    np.testing.assert_array_equal(kept.boxes, boxes.boxes)
    assert not np.array_equal(out, image.astype(np.float32))
    raw, _ = t.plan(np.random.default_rng(3), image.shape, boxes, encoded=False)
    assert raw.distort == () and raw.channels is None  # the fork distorts encoded data only


def test_apply_with_a_plain_recipe_is_mean_and_scale():
    t = transformer("scale: 0.5 mean_value: 10")
    image, _ = scene()
    out = np.empty((3, 40, 60), np.float32)
    t.apply(image, Recipe(), out)
    np.testing.assert_array_equal(out, (image.astype(np.float32) - 10) * 0.5)


@pytest.mark.parametrize("text, message", [
    ("noise_param { prob: 0.5 }", "noise_param is not supported"),
    ("resize_param { height: 0 width: 3 }", "needs height and width > 0"),
    ("expand_param { max_expand_ratio: 1 }", "max_expand_ratio must be > 1"),
    ("expand_param { max_expand_ratio: nan }", "max_expand_ratio must be > 1 and finite, got nan"),
    ("expand_param { max_expand_ratio: inf }", "max_expand_ratio must be > 1 and finite"),
    ("expand_param { max_expand_ratio: 2 } mean_file: 'm'", "with a mean_file is not supported"),
    ("distort_param { brightness_delta: -1 }", "deltas >= 0"),
])  # fmt: skip
def test_refused_settings(text, message):
    with pytest.raises(DataError, match=message):
        transformer(text)
    with pytest.raises(DataError, match="min_scale <= max_scale"):
        transformer("", "batch_sampler { sampler { min_scale: 0 } }")


def test_an_expansion_past_what_an_image_holds_is_refused_in_one_line():
    """max_expand_ratio 1e9 on a small image: a canvas of ~10^19 cells is refused before it is
    allocated, naming the layer's transform and the sizes."""
    t = transformer("expand_param { prob: 1 max_expand_ratio: 1e9 }")
    image, boxes = scene()
    with pytest.raises(DataError, match=r"max_expand_ratio 1000000000.0 expands a") as error:
        for seed in range(5):
            run(t, image, boxes, seed)
    assert len(str(error.value).splitlines()) == 1
