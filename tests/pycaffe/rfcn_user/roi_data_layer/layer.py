"""A RoIDataLayer in py-R-FCN's interface: py-faster-rcnn's (one image of the roidb per
forward, BGR minus the pixel means; tops data, im_info, gt_boxes) but, as py-R-FCN's forward
does, a 2-D blob other than im_info given 4-D: gt_boxes (G, 5, 1, 1)."""

import pickle

import cv2
import numpy as np
import yaml
from fast_rcnn.config import cfg

import caffe2jax as caffe

PIXEL_MEANS = np.array([[[102.9801, 115.9465, 122.7717]]])


class RoIDataLayer(caffe.Layer):
    def setup(self, bottom, top):
        params = yaml.load(self.param_str, Loader=yaml.Loader)
        self._num_classes = params["num_classes"]
        if "seed" in params:  # train_net.py's np.random.seed(cfg.RNG_SEED), for runs without it
            np.random.seed(params["seed"])
        if "roidb" in params:  # a pickled roidb, for runs with no script to call set_roidb
            with open(params["roidb"], "rb") as f:
                self.set_roidb(pickle.load(f))
        top[0].reshape(cfg.TRAIN.IMS_PER_BATCH, 3, max(cfg.TRAIN.SCALES), cfg.TRAIN.MAX_SIZE)
        top[1].reshape(1, 3)
        top[2].reshape(1, 4)  # py-R-FCN's setup shape; forward gives (G, 5, 1, 1)

    def set_roidb(self, roidb):
        self._roidb = roidb
        self._perm = np.random.permutation(np.arange(len(roidb)))
        self._cur = 0

    def _next(self):
        if self._cur + cfg.TRAIN.IMS_PER_BATCH >= len(self._roidb):
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
        gt = np.hstack([entry["boxes"], entry["gt_classes"][:, None]])
        blobs = (im.transpose(2, 0, 1)[None], np.array([[im.shape[0], im.shape[1], 1.0]]),
                 gt.reshape(gt.shape[0], gt.shape[1], 1, 1))  # fmt: skip
        for top_blob, blob in zip(top, blobs):
            top_blob.reshape(*blob.shape)
            top_blob.data[...] = blob.astype(np.float32, copy=False)

    def backward(self, top, propagate_down, bottom):
        pass

    def reshape(self, bottom, top):
        pass
