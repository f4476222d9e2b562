"""py-faster-rcnn's generate_anchors rule (base 16, ratio-major, numpy rounding)."""

import numpy as np


def generate_anchors(base_size=16, ratios=(0.5, 1, 2), scales=(8, 16, 32)):
    ctr = 0.5 * (base_size - 1)
    out = []
    for r in ratios:
        ws = np.round(np.sqrt(base_size * base_size / r))
        hs = np.round(ws * r)
        for s in scales:
            w, h = ws * s, hs * s
            out.append(
                [ctr - 0.5 * (w - 1), ctr - 0.5 * (h - 1), ctr + 0.5 * (w - 1), ctr + 0.5 * (h - 1)]
            )
    return np.array(out)
