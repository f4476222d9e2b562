"""A ProposalTargetLayer in py-R-FCN's interface (our own code): the gt boxes (G, 5, 1, 1)
join the proposals; with BATCH_SIZE −1 every candidate is kept, the fg (IoU ≥ FG_THRESH) in
``npr.choice`` order then the bg; with AGNOSTIC a fg roi's targets go to slot 1 (columns 4..8)
whatever its class; every top 4-D: rois (R, 5, 1, 1), labels (R, 1, 1, 1), targets and
weights (R, 4K, 1, 1)."""

import numpy as np
import numpy.random as npr
import yaml
from fast_rcnn.bbox_transform import bbox_overlaps, bbox_transform
from fast_rcnn.config import cfg

import caffe2jax as caffe

forwards = []  # (proposals given, rois kept, fg among them) of each forward, for the tests


class ProposalTargetLayer(caffe.Layer):
    def setup(self, bottom, top):
        params = yaml.load(self.param_str, Loader=yaml.Loader)
        self._num_classes = params["num_classes"]
        top[0].reshape(1, 5, 1, 1)
        top[1].reshape(1, 1, 1, 1)
        for i in (2, 3, 4):
            top[i].reshape(1, self._num_classes * 4, 1, 1)

    def forward(self, bottom, top):
        gt = bottom[1].data.reshape(bottom[1].data.shape[0], bottom[1].data.shape[1])
        zeros = np.zeros((gt.shape[0], 1), dtype=gt.dtype)
        all_rois = np.vstack((bottom[0].data, np.hstack((zeros, gt[:, :-1]))))
        assert np.all(all_rois[:, 0] == 0), "Only single item batches are supported"
        per_image = np.inf if cfg.TRAIN.BATCH_SIZE == -1 else cfg.TRAIN.BATCH_SIZE
        labels, rois, targets, inside = _sample_rois(
            all_rois, gt, np.round(cfg.TRAIN.FG_FRACTION * per_image), per_image, self._num_classes
        )
        forwards.append((len(bottom[0].data), len(rois), int(np.sum(labels > 0))))
        outputs = (rois, labels, targets, inside, np.array(inside > 0).astype(np.float32))
        for blob, value in zip(top, outputs):
            value = value.reshape(value.shape[0], -1, 1, 1)
            blob.reshape(*value.shape)
            blob.data[...] = value

    def backward(self, top, propagate_down, bottom):
        pass

    def reshape(self, bottom, top):
        pass


def _sample_rois(all_rois, gt, fg_per_image, per_image, num_classes):
    t = cfg.TRAIN
    overlaps = bbox_overlaps(all_rois[:, 1:5].astype(np.float64), gt[:, :4].astype(np.float64))
    assign, max_ov = overlaps.argmax(1), overlaps.max(1)
    labels = gt[assign, 4]
    fg = np.where(max_ov >= t.FG_THRESH)[0]
    fg_count = int(min(fg_per_image, fg.size))
    if fg.size > 0:
        fg = npr.choice(fg, size=fg_count, replace=False)
    bg = np.where((max_ov < t.BG_THRESH_HI) & (max_ov >= t.BG_THRESH_LO))[0]
    bg_count = int(min(per_image - fg_count, bg.size))
    if bg.size > 0:
        bg = npr.choice(bg, size=bg_count, replace=False)
    keep = np.append(fg, bg).astype(np.int64)
    labels = labels[keep]
    labels[fg_count:] = 0
    rois = all_rois[keep]
    deltas = bbox_transform(rois[:, 1:5], gt[assign[keep], :4])
    deltas = (deltas - np.array(t.BBOX_NORMALIZE_MEANS)) / np.array(t.BBOX_NORMALIZE_STDS)
    targets = np.zeros((len(keep), 4 * num_classes), np.float32)
    inside = np.zeros_like(targets)
    for i in np.where(labels > 0)[0]:
        start = 4 * (1 if t.AGNOSTIC else int(labels[i]))
        targets[i, start : start + 4] = deltas[i]
        inside[i, start : start + 4] = t.BBOX_INSIDE_WEIGHTS
    return labels, rois, targets, inside
