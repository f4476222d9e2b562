"""An AnchorTargetLayer in py-R-FCN's interface (numpy, ``npr.choice`` subsampling): gt_boxes
arrive (G, 5, 1, 1) and are flattened to (G, 5); the thresholds, batch and weights are
``cfg.TRAIN``'s; with RPN_NORMALIZE_TARGETS the targets are (t − means) / stds."""

import numpy as np
import numpy.random as npr
import yaml
from fast_rcnn.bbox_transform import bbox_overlaps, bbox_transform
from fast_rcnn.config import cfg

import caffe2jax as caffe
from rpn.generate_anchors import generate_anchors


class AnchorTargetLayer(caffe.Layer):
    def setup(self, bottom, top):
        params = yaml.load(self.param_str, Loader=yaml.Loader)
        self._anchors = generate_anchors(scales=np.array(params.get("scales", (8, 16, 32))))
        self._feat_stride = params["feat_stride"]
        a = len(self._anchors)
        height, width = bottom[0].data.shape[-2:]
        top[0].reshape(1, 1, a * height, width)
        for i in (1, 2, 3):
            top[i].reshape(1, 4 * a, height, width)

    def _labels(self, overlaps):
        t = cfg.TRAIN
        arg = overlaps.argmax(1)
        best_anchor = overlaps.max(0)
        labels = np.full(len(overlaps), -1.0, np.float32)
        labels[overlaps.max(1) < t.RPN_NEGATIVE_OVERLAP] = 0
        labels[np.where(overlaps == best_anchor)[0]] = 1
        labels[overlaps.max(1) >= t.RPN_POSITIVE_OVERLAP] = 1
        fg = np.where(labels == 1)[0]
        num_fg = int(t.RPN_FG_FRACTION * t.RPN_BATCHSIZE)
        if len(fg) > num_fg:
            labels[npr.choice(fg, size=len(fg) - num_fg, replace=False)] = -1
        bg = np.where(labels == 0)[0]
        num_bg = t.RPN_BATCHSIZE - np.sum(labels == 1)
        if len(bg) > num_bg:
            labels[npr.choice(bg, size=len(bg) - num_bg, replace=False)] = -1
        return labels, arg

    def forward(self, bottom, top):
        t = cfg.TRAIN
        height, width = bottom[0].data.shape[-2:]
        gt = bottom[1].data.reshape(bottom[1].data.shape[0], bottom[1].data.shape[1])
        info = bottom[2].data[0]
        sx, sy = np.meshgrid(np.arange(width) * self._feat_stride,
                             np.arange(height) * self._feat_stride)  # fmt: skip
        shifts = np.vstack((sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel())).T
        a = len(self._anchors)
        allb = (self._anchors[None] + shifts[:, None]).reshape(-1, 4)
        inds = np.where((allb[:, 0] >= 0) & (allb[:, 1] >= 0)
                        & (allb[:, 2] < info[1]) & (allb[:, 3] < info[0]))[0]  # fmt: skip
        anchors = allb[inds]
        labels, arg = self._labels(bbox_overlaps(anchors.astype(float), gt[:, :4].astype(float)))
        targets = bbox_transform(anchors, gt[arg, :4]).astype(np.float32)
        if t.RPN_NORMALIZE_TARGETS:
            targets = (targets - np.array(t.RPN_NORMALIZE_MEANS)) / np.array(t.RPN_NORMALIZE_STDS)
        w_in = np.zeros((len(inds), 4), np.float32)
        w_in[labels == 1] = t.RPN_BBOX_INSIDE_WEIGHTS
        w_out = np.zeros((len(inds), 4), np.float32)
        w_out[labels >= 0] = 1.0 / np.sum(labels >= 0)  # RPN_POSITIVE_WEIGHT −1: uniform

        def unmap(x, fill):
            out = np.full((len(allb),) + x.shape[1:], fill, np.float32)
            out[inds] = x
            return out

        lab = unmap(labels, -1).reshape(1, height, width, a).transpose(0, 3, 1, 2)
        tops = [lab.reshape(1, 1, a * height, width)]
        for x in (targets, w_in, w_out):
            tops.append(unmap(x, 0).reshape(1, height, width, 4 * a).transpose(0, 3, 1, 2))
        for blob, value in zip(top, tops):
            blob.reshape(*value.shape)
            blob.data[...] = value

    def backward(self, top, propagate_down, bottom):
        pass

    def reshape(self, bottom, top):
        pass
