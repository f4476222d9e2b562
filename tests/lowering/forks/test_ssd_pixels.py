"""lowering/forks/ssd_pixels.py: DetectionEvaluate with ``name_size_file`` — IoU on pixel boxes
with the fork's +1 sizes, the image counter carried across forwards (and not advanced by an
image without detection rows), the letterbox projection of FIT_LARGE_SIZE_AND_PAD; all
hand-worked from weiliu89/caffe bbox_util.cpp."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.lowering.boxes.iou import SSD_PIXELS, iou
from caffe2jax.lowering.forks.ssd_pixels import name_sizes, output_bbox
from caffe2jax.lowering.model import compile as compile_net
from tests import jitted
from tests.lowering.fork_nets import net

PAD8, PAD7 = [-1.0] * 8, [-1.0] * 7
FIT_LARGE = caffe_pb2.ResizeParameter.FIT_LARGE_SIZE_AND_PAD
GT = [0.1, 0.1, 0.45, 0.5]
DET_BOX = [0.1, 0.1, 0.5, 0.5]
# on a 200 × 100 (w × h) image: det [20, 10, 100, 50] size 81·41 = 3321, gt [20, 10, 90, 50]
# size 71·41 = 2911 = the intersection: IoU 2911 / 3321 = 0.87654; normalized: 0.875
PIXEL_IOU = 2911 / 3321


def _model(tmp_path, lines: str, threshold: float, extra: str = ""):
    sizes = tmp_path / "sizes.txt"
    sizes.write_text(lines)
    text = net('layer { name: "ev" type: "DetectionEvaluate" bottom: "det" bottom: "label" '
               'top: "y" detection_evaluate_param { num_classes: 2 background_label_id: 0 '
               f'overlap_threshold: {threshold} name_size_file: "{sizes}" {extra} }} }}',
               {"det": (1, 1, 4, 7), "label": (1, 1, 3, 8)})  # fmt: skip
    return compile_net(text)


def _forward(model, state, det, label):
    params, _ = model.init(0)
    feed = {"det": jnp.asarray(det, jnp.float32).reshape(1, 1, 4, 7),
            "label": jnp.asarray(label, jnp.float32).reshape(1, 1, 3, 8)}  # fmt: skip
    blobs, state = jitted.forward(model, params, state, feed, jax.random.key(0))
    return np.asarray(blobs["y"])[0, 0], state


def _tp(rows: np.ndarray) -> list[float]:
    return [r[3] for r in rows[1:] if r[0] >= 0]


def test_pixel_iou_with_plus_one_sizes_decides_the_match(tmp_path):
    """Threshold 0.876 between the normalized IoU (0.875: fp) and the pixel one (0.8765: tp)."""
    model = _model(tmp_path, "img0 100 200\n", 0.876)
    det = [[0, 1, 0.9, *DET_BOX], PAD7, PAD7, PAD7]
    label = [[0, 1, 0, *GT, 0], PAD8, PAD8]
    rows, _ = _forward(model, model.init(0)[1], det, label)
    assert _tp(rows) == [1.0]
    a, sa = output_bbox(jnp.asarray([DET_BOX]), jnp.asarray([[100.0, 200.0]]), None)
    b, sb = output_bbox(jnp.asarray([GT]), jnp.asarray([[100.0, 200.0]]), None)
    np.testing.assert_allclose(a, [[20, 10, 100, 50]], rtol=1e-6)
    np.testing.assert_allclose([sa[0], sb[0]], [3321, 2911])
    np.testing.assert_allclose(iou(a, b, SSD_PIXELS, sizes=(sa, sb)), [[PIXEL_IOU]], rtol=1e-6)


def test_disjoint_boxes_overlap_one_pixel_as_the_fork_computes():
    """[0,0,10,10] and [50,50,60,60] (sizes 121): the zero intersection box counts 1·1 →
    IoU 1 / 241."""
    a = jnp.asarray([[0.0, 0.0, 10.0, 10.0]])
    b = jnp.asarray([[50.0, 50.0, 60.0, 60.0]])
    size = jnp.asarray([121.0])
    np.testing.assert_allclose(iou(a, b, SSD_PIXELS, sizes=(size, size)), [[1 / 241]], rtol=1e-6)


def test_image_counter_carries_across_forwards_and_wraps(tmp_path):
    """Sizes 100×200, 50×50, 100×200 (h × w). Forward 1: images 0 and 1 take lines 0 and 1;
    forward 2: lines 2 and 0 (wrap). On a 50×50 image the det box is [5,5,25,25] (size 441)
    and the gt [5,5,22.5,25] (size 18.5·21 = 388.5): IoU 0.881 > 0.876, a tp there too, but at
    threshold 0.88 only on the 50×50 image."""
    model = _model(tmp_path, "a 100 200\nb 50 50\nc 100 200\n", 0.88)
    det = [[0, 1, 0.9, *DET_BOX], [1, 1, 0.8, *DET_BOX], PAD7, PAD7]
    label = [[0, 1, 0, *GT, 0], [1, 1, 0, *GT, 0], PAD8]
    state = model.init(0)[1]
    rows, state = _forward(model, state, det, label)
    assert _tp(rows) == [0.0, 1.0]  # image 0 on line 0 (100×200), image 1 on line 1 (50×50)
    assert float(state.carry["ev"][0][0]) == 2
    rows, state = _forward(model, state, det, label)
    assert _tp(rows) == [0.0, 0.0]  # lines 2 and 0: both 100×200
    assert float(state.carry["ev"][0][0]) == 1


def test_an_image_without_detections_takes_no_line(tmp_path):
    """Only image 1 has a row: it takes line 0 (100×200, fp at 0.88) and the counter moves 1."""
    model = _model(tmp_path, "a 100 200\nb 50 50\n", 0.88)
    det = [[1, 1, 0.8, *DET_BOX], PAD7, PAD7, PAD7]
    label = [[0, 1, 0, *GT, 0], [1, 1, 0, *GT, 0], PAD8]
    rows, state = _forward(model, model.init(0)[1], det, label)
    assert _tp(rows) == [0.0]
    assert float(state.carry["ev"][0][0]) == 1


def test_letterbox_projection_of_fit_large_size_and_pad():
    """A 200 × 100 image in a 300 × 300 canvas: padding 75 px top and bottom, so the image is
    y ∈ [0.25, 0.75]; [0.5, 0.25, 1, 0.75] → [0.5, 0, 1, 1] → [100, 0, 200, 100]. A box that
    misses the image area ([0, 0, 1, 0.2]) is used unprojected: [0, 0, 200, 20]."""
    from caffe2jax.frontend import caffe_pb2

    resize = (caffe_pb2.ResizeParameter.FIT_LARGE_SIZE_AND_PAD, 300.0, 300.0)
    boxes = jnp.asarray([[0.5, 0.25, 1.0, 0.75], [0.0, 0.0, 1.0, 0.2]])
    out, size = output_bbox(boxes, jnp.asarray([[100.0, 200.0]] * 2), resize)
    np.testing.assert_allclose(out, [[100, 0, 200, 100], [0, 0, 200, 20]], rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(size, [101 * 101, 201 * 21], rtol=1e-5)


def test_name_size_file_reading_stops_at_the_first_bad_line(tmp_path):
    path = tmp_path / "sizes.txt"
    path.write_text("a 10 20\nb 30 40\nc x 5\nd 1 1\n")
    np.testing.assert_array_equal(name_sizes(None, str(path)), [[10, 20], [30, 40]])


def test_pycaffe_forwards_carry_the_counter(tmp_path):
    """The same two forwards through pycaffe's Net (as a test net is run by hand)."""
    import caffe2jax as caffe

    sizes = tmp_path / "sizes.txt"
    sizes.write_text("a 100 200\nb 50 50\nc 100 200\n")
    proto = tmp_path / "eval.prototxt"
    proto.write_text(net(
        'layer { name: "ev" type: "DetectionEvaluate" bottom: "det" bottom: "label" top: "y" '
        "detection_evaluate_param { num_classes: 2 background_label_id: 0 "
        f'overlap_threshold: 0.88 name_size_file: "{sizes}" }} }}',
        {"det": (1, 1, 4, 7), "label": (1, 1, 3, 8)}))  # fmt: skip
    model = caffe.Net(str(proto), caffe.TEST)
    model.blobs["det"].data[...] = np.asarray(
        [[0, 1, 0.9, *DET_BOX], [1, 1, 0.8, *DET_BOX], PAD7, PAD7]
    ).reshape(1, 1, 4, 7)
    model.blobs["label"].data[...] = np.asarray(
        [[0, 1, 0, *GT, 0], [1, 1, 0, *GT, 0], PAD8]).reshape(1, 1, 3, 8)  # fmt: skip
    assert _tp(model.forward()["y"][0, 0].copy()) == [0.0, 1.0]
    assert _tp(model.forward()["y"][0, 0].copy()) == [0.0, 0.0]
    assert _tp(model.forward()["y"][0, 0].copy()) == [1.0, 0.0]  # lines 1 and 2


def fork_output_bbox(box, hw, resize=None):
    """OutputBBox (bbox_util.cpp) in float32: the FIT_LARGE_SIZE_AND_PAD letterbox, ClipBBox,
    ScaleBBox and the cached +1 size (each product and quotient rounded to float)."""
    f = np.float32
    box = box.astype(f)
    if resize is not None and resize[0] == FIT_LARGE:
        _, rh, rw = (f(v) for v in resize)
        aspect = hw[:, 1] / hw[:, 0]
        wide = aspect > rw / rh
        pad_h, pad_w = (rh - rw / aspect) / f(2), (rw - rh * aspect) / f(2)
        src = np.stack([np.where(wide, f(0), pad_w / rw), np.where(wide, pad_h / rh, f(0)),
                        np.where(wide, f(1), f(1) - pad_w / rw),
                        np.where(wide, f(1) - pad_h / rh, f(1))], 1)  # fmt: skip
        miss = ((box[:, 0] >= src[:, 2]) | (box[:, 2] <= src[:, 0])
                | (box[:, 1] >= src[:, 3]) | (box[:, 3] <= src[:, 1]))  # fmt: skip
        size = np.concatenate([src[:, 2:] - src[:, :2]] * 2, 1)
        proj = np.clip((box - np.concatenate([src[:, :2]] * 2, 1)) / size, f(0), f(1))
        box = np.where(miss[:, None], box, proj)
    scale = np.stack([hw[:, 1], hw[:, 0], hw[:, 1], hw[:, 0]], 1)
    out = np.clip(box, f(0), f(1)) * scale
    w, h = out[:, 2] - out[:, 0], out[:, 3] - out[:, 1]
    return out, np.where((w < 0) | (h < 0), f(0), (w + f(1)) * (h + f(1)))


def fork_jaccard_pixels(a, sa, b, sb):
    """JaccardOverlap(…, normalized=false) in float32."""
    f = np.float32
    ax1, ay1, ax2, ay2 = (a[:, None, i] for i in range(4))
    bx1, by1, bx2, by2 = (b[None, :, i] for i in range(4))
    disjoint = (bx1 > ax2) | (bx2 < ax1) | (by1 > ay2) | (by2 < ay1)
    iw = np.where(disjoint, f(1), np.minimum(ax2, bx2) - np.maximum(ax1, bx1) + f(1))
    ih = np.where(disjoint, f(1), np.minimum(ay2, by2) - np.maximum(ay1, by1) + f(1))
    inter = iw * ih
    with np.errstate(invalid="ignore", divide="ignore"):
        overlap = inter / (sa[:, None] + sb[None, :] - inter)
    return np.where((iw > 0) & (ih > 0), overlap, f(0)).astype(f)


def test_pixel_boxes_and_overlaps_are_the_forks_float32_under_jit():
    """Random normalized boxes on images of odd sizes, plain and letterboxed into 300 × 300
    (resize_height a divisor jit would turn into a product): pixel boxes, +1 sizes and the
    IoU that decides a true positive, bit for bit."""
    rng = np.random.default_rng(4)
    n = 600
    xy = rng.random((n, 2), dtype=np.float32) * np.float32(0.7)
    box = np.concatenate([xy, xy + rng.random((n, 2), dtype=np.float32) * np.float32(0.3)], 1)
    hw = rng.integers(97, 1013, (n, 2)).astype(np.float32)
    for resize in (None, (FIT_LARGE, 300.0, 300.0), (FIT_LARGE, 300.0, 512.0)):
        out, size = jax.jit(lambda b, s, r=resize: output_bbox(b, s, r))(box, hw)
        want_out, want_size = fork_output_bbox(box, hw, resize)
        np.testing.assert_array_equal(np.asarray(out).view(np.uint32), want_out.view(np.uint32))
        np.testing.assert_array_equal(np.asarray(size), want_size)
        pairs = jax.jit(lambda a, sa, b, sb: iou(a, b, SSD_PIXELS, (sa, sb)))
        got = pairs(out[:300], size[:300], out[300:], size[300:])
        want = fork_jaccard_pixels(want_out[:300], want_size[:300], want_out[300:], want_size[300:])
        np.testing.assert_array_equal(np.asarray(got).view(np.uint32), want.view(np.uint32))
