"""A ProposalLayer in py-R-FCN's interface (our own code): py-faster-rcnn's (anchors,
decoding, clipping, min size, pre-NMS top N, NMS, post-NMS top N, ``top[0].reshape(n, 5)`` in
forward) with py-R-FCN's two changes: the config key is ``'TRAIN' if self.phase == 0 else
'TEST'`` and in TRAIN, with RPN_NORMALIZE_TARGETS, the deltas are un-normalized (× stds +
means) before decoding. Ties in score keep anchor order (a stable sort)."""

import os

import numpy as np
import yaml
from fast_rcnn.bbox_transform import bbox_transform_inv, clip_boxes, nms
from fast_rcnn.config import cfg

import caffe2jax as caffe
from rpn.generate_anchors import generate_anchors

forwards = []  # (config key, number of proposals) of each forward, for the tests


class ProposalLayer(caffe.Layer):
    def setup(self, bottom, top):
        params = yaml.load(self.param_str, Loader=yaml.Loader)
        self._feat_stride = params["feat_stride"]
        self._anchors = generate_anchors(scales=np.array(params.get("scales", (8, 16, 32))))
        self._num_anchors = self._anchors.shape[0]
        top[0].reshape(1, 5)
        if len(top) > 1:
            top[1].reshape(1, 1, 1, 1)

    def forward(self, bottom, top):
        assert bottom[0].data.shape[0] == 1, "Only single item batches are supported"
        key = "TRAIN" if self.phase == 0 else "TEST"
        settings = cfg[key]
        scores = bottom[0].data[:, self._num_anchors :, :, :]
        im_info = bottom[2].data[0, :]
        height, width = scores.shape[-2:]
        sx, sy = np.meshgrid(np.arange(width) * self._feat_stride,
                             np.arange(height) * self._feat_stride)  # fmt: skip
        shifts = np.vstack((sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel())).T
        anchors = (self._anchors[None] + shifts[:, None]).reshape(-1, 4)
        deltas = bottom[1].data.transpose((0, 2, 3, 1)).reshape((-1, 4))
        if key == "TRAIN" and cfg.TRAIN.RPN_NORMALIZE_TARGETS:
            deltas = deltas * np.array(cfg.TRAIN.RPN_NORMALIZE_STDS, np.float32)
            deltas = deltas + np.array(cfg.TRAIN.RPN_NORMALIZE_MEANS, np.float32)
        scores = scores.transpose((0, 2, 3, 1)).reshape((-1, 1))
        proposals = clip_boxes(bbox_transform_inv(anchors, deltas), im_info[:2])
        min_size = settings.RPN_MIN_SIZE * im_info[2]
        ws = proposals[:, 2] - proposals[:, 0] + 1
        hs = proposals[:, 3] - proposals[:, 1] + 1
        keep = np.where((ws >= min_size) & (hs >= min_size))[0]
        proposals, scores = proposals[keep, :], scores[keep]
        order = np.argsort(-scores.ravel(), kind="stable")[: settings.RPN_PRE_NMS_TOP_N]
        proposals, scores = proposals[order, :], scores[order]
        keep = nms(np.hstack((proposals, scores)), settings.RPN_NMS_THRESH)
        keep = keep[: settings.RPN_POST_NMS_TOP_N]
        proposals, scores = proposals[keep, :], scores[keep]
        blob = np.hstack((np.zeros((proposals.shape[0], 1), np.float32), proposals))
        forwards.append((key, blob.shape[0]))
        if os.environ.get("RFCN_USER_LOG"):  # the tests' record of a run in another process
            with open(os.environ["RFCN_USER_LOG"], "a") as log:
                log.write(f"{key} {blob.shape[0]}\n")
        top[0].reshape(*blob.shape)
        top[0].data[...] = blob
        if len(top) > 1:
            top[1].reshape(*scores.shape)
            top[1].data[...] = scores

    def backward(self, top, propagate_down, bottom):
        pass

    def reshape(self, bottom, top):
        pass
