"""The forks' region pooling kernels transcribed as NumPy loops, float32 where the C++ is float:
Fast R-CNN's ROIPoolForward / ROIPoolBackward (rbgirshick/caffe-fast-rcnn
src/caffe/layers/roi_pooling_layer.cu; the .cpp computes the same bins) and R-FCN's
PSROIPoolingForward / PSROIPoolingBackwardAtomic (daijifeng001/caffe-rfcn
src/caffe/layers/psroi_pooling_layer.cu). NumPy's float32 scalars round every operation
to float32, as the C++ does; nothing here is rewritten by a compiler.

The loops run per roi and per bin; inside a bin they are vectorised over channels and cells
(the C++'s "first cell whose value is > the running max, from -FLT_MAX" is the first maximum in
row-major order among the values above -FLT_MAX).
"""

from __future__ import annotations

import math

import numpy as np

F = np.float32
FLT_MAX = F(np.finfo(np.float32).max)


def c_round(v) -> float:
    """C's round() of a float32 value: halves away from zero (exact in double)."""
    v = float(v)
    return math.copysign(math.floor(abs(v) + 0.5), v)


def roi_corners(roi, scale) -> list[int]:
    """``int roi_start_w = round(bottom_rois[1] * spatial_scale)`` … for x1, y1, x2, y2."""
    return [int(c_round(F(roi[i]) * F(scale))) for i in (1, 2, 3, 4)]


def roi_bins(start, end, pooled: int, extent: int):
    """ROIPoolForward's hstart/hend for every ph, clipped, and bin_size_h; for int corners
    (scalars or arrays: the same float32 operations elementwise)."""
    start, end = np.asarray(start), np.asarray(end)
    size = np.maximum(end - start + 1, 1)
    bin_size = (size.astype(F) / F(pooled))[..., None]
    p = np.arange(pooled, dtype=F)
    lo = np.floor(p * bin_size).astype(np.int64) + start[..., None]
    hi = np.ceil((p + F(1)) * bin_size).astype(np.int64) + start[..., None]
    return np.clip(lo, 0, extent), np.clip(hi, 0, extent), bin_size[..., 0]


def roi_pool_forward(x, rois, pooled_h: int, pooled_w: int, scale: float):
    """(top, argmax): ROIPoolForward; argmax is h·W + w, −1 for none."""
    _, channels, height, width = x.shape
    top = np.zeros((len(rois), channels, pooled_h, pooled_w), F)
    arg = np.full(top.shape, -1, np.int64)
    for n, roi in enumerate(rois):
        x1, y1, x2, y2 = roi_corners(roi, scale)
        hs, he, _ = roi_bins(y1, y2, pooled_h, height)
        ws, we, _ = roi_bins(x1, x2, pooled_w, width)
        data = x[int(roi[0])]
        for ph in range(pooled_h):
            for pw in range(pooled_w):
                if he[ph] <= hs[ph] or we[pw] <= ws[pw]:
                    continue  # maxval 0, maxidx -1
                cells = data[:, hs[ph] : he[ph], ws[pw] : we[pw]].reshape(channels, -1)
                index = np.arange(hs[ph], he[ph])[:, None] * width + np.arange(ws[pw], we[pw])
                above = np.where(cells > -FLT_MAX, cells, -np.inf)  # NaN > v is false too
                first = np.argmax(above, axis=1)
                hit = above[np.arange(channels), first] > -FLT_MAX
                top[n, :, ph, pw] = np.where(hit, above[np.arange(channels), first], -FLT_MAX)
                arg[n, :, ph, pw] = np.where(hit, index.ravel()[first], -1)
    return top, arg


def roi_pool_backward(shape, rois, arg, top_diff, scale: float):
    """ROIPoolBackward: per bottom cell inside a roi, the diffs of the bins in its feasible
    set whose argmax it is."""
    _, _, height, width = shape
    pooled_h, pooled_w = arg.shape[2:]
    diff = np.zeros(shape, F)
    for n, roi in enumerate(rois):
        b = int(roi[0])
        x1, y1, x2, y2 = roi_corners(roi, scale)
        bin_h = F(max(y2 - y1 + 1, 1)) / F(pooled_h)
        bin_w = F(max(x2 - x1 + 1, 1)) / F(pooled_w)
        for h in range(max(y1, 0), min(y2 + 1, height)):
            ph0 = min(max(math.floor(F(h - y1) / bin_h), 0), pooled_h)
            ph1 = min(max(math.ceil(F(h - y1 + 1) / bin_h), 0), pooled_h)
            for w in range(max(x1, 0), min(x2 + 1, width)):
                pw0 = min(max(math.floor(F(w - x1) / bin_w), 0), pooled_w)
                pw1 = min(max(math.ceil(F(w - x1 + 1) / bin_w), 0), pooled_w)
                for ph in range(ph0, ph1):
                    for pw in range(pw0, pw1):
                        hit = arg[n, :, ph, pw] == h * width + w
                        diff[b, hit, h, w] += top_diff[n, hit, ph, pw]
    return diff


def psroi_corners(roi, scale):
    """roi_start_w/h and roi_end_w/h: ``static_cast<Dtype>(round(x)) * spatial_scale`` and
    ``static_cast<Dtype>(round(x2) + 1.) * spatial_scale``."""
    s = F(scale)
    x1, y1 = F(c_round(F(roi[1]))) * s, F(c_round(F(roi[2]))) * s
    x2, y2 = F(c_round(F(roi[3])) + 1.0) * s, F(c_round(F(roi[4])) + 1.0) * s
    return x1, y1, x2, y2


def psroi_bins(start, end, k: int, extent: int):
    """PSROIPoolingForward's hstart/hend for every ph, clipped; for float32 corners (scalars
    or arrays: the same float32 operations elementwise)."""
    start, end = np.asarray(start, F), np.asarray(end, F)
    bin_size = (np.maximum(end - start, F(0.1)) / F(k))[..., None]
    p = np.arange(k, dtype=F)
    lo = np.floor(p * bin_size + start[..., None]).astype(np.int64)
    hi = np.ceil((p + F(1)) * bin_size + start[..., None]).astype(np.int64)
    return np.clip(lo, 0, extent), np.clip(hi, 0, extent)


def psroi_pool(x, rois, output_dim: int, k: int, scale: float, top_diff=None):
    """PSROIPoolingForward's top, and with ``top_diff`` PSROIPoolingBackwardAtomic's bottom
    diff (each bin's diff / area added to every cell of the bin)."""
    _, _, height, width = x.shape
    top = np.zeros((len(rois), output_dim, k, k), F)
    diff = np.zeros(x.shape, F)
    for n, roi in enumerate(rois):
        b = int(roi[0])
        x1, y1, x2, y2 = psroi_corners(roi, scale)
        hs, he = psroi_bins(y1, y2, k, height)
        ws, we = psroi_bins(x1, x2, k, width)
        for ph in range(k):
            for pw in range(k):
                if he[ph] <= hs[ph] or we[pw] <= ws[pw]:
                    continue
                area = F((he[ph] - hs[ph]) * (we[pw] - ws[pw]))
                c = (np.arange(output_dim) * k + ph) * k + pw
                cells = x[b, c, hs[ph] : he[ph], ws[pw] : we[pw]].reshape(output_dim, -1)
                top[n, :, ph, pw] = np.cumsum(cells, axis=1, dtype=F)[:, -1] / area
                if top_diff is not None:
                    share = (top_diff[n, :, ph, pw] / area).astype(F)
                    diff[b, c, hs[ph] : he[ph], ws[pw] : we[pw]] += share[:, None, None]
    return top, diff
