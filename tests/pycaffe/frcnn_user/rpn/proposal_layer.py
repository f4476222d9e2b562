"""A ProposalLayer in py-faster-rcnn's interface (our own code): the config by phase
(``cfg[str(self.phase)]``, 'TRAIN' or 'TEST'), anchors at every position, decoding, clipping,
the min-size filter, pre-NMS top N, NMS, post-NMS top N; ``top[0].reshape(n, 5)`` once NMS
has counted, as the original does in forward. Ties in score keep anchor order (numpy's
stable sort; the original's argsort leaves them unspecified)."""

import os

import numpy as np
import yaml
from fast_rcnn.bbox_transform import bbox_transform_inv, clip_boxes, nms
from fast_rcnn.config import cfg

import caffe2jax as caffe
from rpn.generate_anchors import generate_anchors

forwards = []  # (phase, number of proposals) of each forward, for the tests


class ProposalLayer(caffe.Layer):
    def setup(self, bottom, top):
        params = yaml.load(self.param_str_, Loader=yaml.Loader)
        self._feat_stride = params["feat_stride"]
        self._anchors = generate_anchors(scales=np.array(params.get("scales", (8, 16, 32))))
        self._num_anchors = self._anchors.shape[0]
        top[0].reshape(1, 5)
        if len(top) > 1:
            top[1].reshape(1, 1)

    def forward(self, bottom, top):
        assert bottom[0].data.shape[0] == 1, "Only single item batches are supported"
        settings = cfg[str(self.phase)]
        scores = bottom[0].data[:, self._num_anchors :, :, :]
        deltas = bottom[1].data
        im_info = bottom[2].data[0, :]
        height, width = scores.shape[-2:]
        sx, sy = np.meshgrid(np.arange(width) * self._feat_stride,
                             np.arange(height) * self._feat_stride)  # fmt: skip
        shifts = np.vstack((sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel())).T
        anchors = (self._anchors[None] + shifts[:, None]).reshape(-1, 4)
        deltas = deltas.transpose((0, 2, 3, 1)).reshape((-1, 4))
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
        forwards.append((str(self.phase), blob.shape[0]))
        if os.environ.get("FRCNN_USER_LOG"):  # the tests' record of a run in another process
            with open(os.environ["FRCNN_USER_LOG"], "a") as log:
                log.write(f"{self.phase} {blob.shape[0]}\n")
        top[0].reshape(*blob.shape)
        top[0].data[...] = blob
        if len(top) > 1:
            top[1].reshape(*scores.shape)
            top[1].data[...] = scores

    def backward(self, top, propagate_down, bottom):
        pass

    def reshape(self, bottom, top):
        pass
