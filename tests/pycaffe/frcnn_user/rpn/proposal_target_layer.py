"""A ProposalTargetLayer in py-faster-rcnn's interface (our own code): the gt boxes join the
proposals, fg (IoU ≥ FG_THRESH, at most FG_FRACTION of BATCH_SIZE) and bg rois are drawn with
``npr.choice``, their regression targets normalized and spread into 4·num_classes columns;
each top reshaped in forward to the R rois drawn (R varies: fewer when few qualify)."""

import numpy as np
import numpy.random as npr
import yaml
from fast_rcnn.bbox_transform import bbox_overlaps, bbox_transform
from fast_rcnn.config import cfg

import caffe2jax as caffe

forwards = []  # (proposals given, rois drawn, fg among them) of each forward, for the tests


class ProposalTargetLayer(caffe.Layer):
    def setup(self, bottom, top):
        params = yaml.load(self.param_str_, Loader=yaml.Loader)
        self._num_classes = params["num_classes"]
        top[0].reshape(1, 5)
        top[1].reshape(1, 1)
        for i in (2, 3, 4):
            top[i].reshape(1, self._num_classes * 4)

    def forward(self, bottom, top):
        gt_boxes = bottom[1].data
        zeros = np.zeros((gt_boxes.shape[0], 1), dtype=gt_boxes.dtype)
        all_rois = np.vstack((bottom[0].data, np.hstack((zeros, gt_boxes[:, :-1]))))
        assert np.all(all_rois[:, 0] == 0), "Only single item batches are supported"
        rois_per_image = cfg.TRAIN.BATCH_SIZE
        fg_per_image = int(np.round(cfg.TRAIN.FG_FRACTION * rois_per_image))
        labels, rois, targets, inside = _sample_rois(
            all_rois, gt_boxes, fg_per_image, rois_per_image, self._num_classes
        )
        forwards.append((len(bottom[0].data), len(rois), int(np.sum(labels > 0))))
        outputs = (rois, labels, targets, inside, np.array(inside > 0).astype(np.float32))
        for blob, value in zip(top, outputs):
            blob.reshape(*value.shape)
            blob.data[...] = value

    def backward(self, top, propagate_down, bottom):
        pass

    def reshape(self, bottom, top):
        pass


def _sample_rois(all_rois, gt_boxes, fg_per_image, rois_per_image, num_classes):
    overlaps = bbox_overlaps(
        all_rois[:, 1:5].astype(np.float64), gt_boxes[:, :4].astype(np.float64)
    )
    gt_assignment = overlaps.argmax(axis=1)
    max_overlaps = overlaps.max(axis=1)
    labels = gt_boxes[gt_assignment, 4]
    fg_inds = np.where(max_overlaps >= cfg.TRAIN.FG_THRESH)[0]
    fg_count = min(fg_per_image, fg_inds.size)
    if fg_inds.size > 0:
        fg_inds = npr.choice(fg_inds, size=fg_count, replace=False)
    bg_inds = np.where((max_overlaps < cfg.TRAIN.BG_THRESH_HI)
                       & (max_overlaps >= cfg.TRAIN.BG_THRESH_LO))[0]  # fmt: skip
    bg_count = min(rois_per_image - fg_count, bg_inds.size)
    if bg_inds.size > 0:
        bg_inds = npr.choice(bg_inds, size=bg_count, replace=False)
    keep = np.append(fg_inds, bg_inds)
    labels = labels[keep]
    labels[fg_count:] = 0
    rois = all_rois[keep]
    deltas = bbox_transform(rois[:, 1:5], gt_boxes[gt_assignment[keep], :4])
    deltas = (deltas - np.array(cfg.TRAIN.BBOX_NORMALIZE_MEANS)) / np.array(
        cfg.TRAIN.BBOX_NORMALIZE_STDS)  # fmt: skip
    targets = np.zeros((len(keep), 4 * num_classes), np.float32)
    inside = np.zeros_like(targets)
    for i in np.where(labels > 0)[0]:
        start = 4 * int(labels[i])
        targets[i, start : start + 4] = deltas[i]
        inside[i, start : start + 4] = cfg.TRAIN.BBOX_INSIDE_WEIGHTS
    return labels, rois, targets, inside
