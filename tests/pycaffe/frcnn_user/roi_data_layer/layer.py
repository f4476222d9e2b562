"""A RoIDataLayer in py-faster-rcnn's interface: one image of the roidb per forward, BGR minus
the pixel means, tops data, im_info, gt_boxes (end-to-end form)."""

import cv2
import numpy as np
import yaml

import caffe2jax as caffe

PIXEL_MEANS = np.array([[[102.9801, 115.9465, 122.7717]]])


class RoIDataLayer(caffe.Layer):
    def setup(self, bottom, top):
        params = yaml.load(self.param_str_, Loader=yaml.Loader)  # PyYAML 6 needs the Loader
        self._num_classes = params["num_classes"]
        self._roidb = None
        top[0].reshape(1, 3, 64, 64)
        top[1].reshape(1, 3)
        top[2].reshape(2, 5)

    def set_roidb(self, roidb):
        self._roidb = roidb
        self._perm = np.random.permutation(np.arange(len(roidb)))
        self._cur = 0

    def _next(self):
        if self._cur >= len(self._roidb):
            self._perm = np.random.permutation(np.arange(len(self._roidb)))
            self._cur = 0
        entry = self._roidb[self._perm[self._cur]]
        self._cur += 1
        return entry

    def forward(self, bottom, top):
        entry = self._next()
        im = cv2.imread(entry["image"]).astype(np.float32)
        if entry["flipped"]:
            im = im[:, ::-1, :]
        im -= PIXEL_MEANS
        top[0].data[...] = im.transpose(2, 0, 1)[None]
        top[1].data[...] = [[im.shape[0], im.shape[1], 1.0]]
        gt = np.hstack([entry["boxes"], entry["gt_classes"][:, None]])
        top[2].data[...] = gt

    def backward(self, top, propagate_down, bottom):
        pass

    def reshape(self, bottom, top):
        pass
