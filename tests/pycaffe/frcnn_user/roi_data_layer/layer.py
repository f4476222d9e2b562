"""A RoIDataLayer in py-faster-rcnn's interface: one image of the roidb per forward, BGR minus
the pixel means, tops data, im_info, gt_boxes (end-to-end form), each reshaped in forward to
the image's size and box count as the original does."""

import pickle

import cv2
import numpy as np
import yaml
from fast_rcnn.config import cfg

import caffe2jax as caffe

PIXEL_MEANS = np.array([[[102.9801, 115.9465, 122.7717]]])


class RoIDataLayer(caffe.Layer):
    def setup(self, bottom, top):
        params = yaml.load(self.param_str_, Loader=yaml.Loader)  # PyYAML 6 needs the Loader
        self._num_classes = params["num_classes"]
        self._roidb = None
        if "seed" in params:  # train_net.py's np.random.seed(cfg.RNG_SEED), for runs without it
            np.random.seed(params["seed"])
        if "roidb" in params:  # a pickled roidb, for runs with no script to call set_roidb
            with open(params["roidb"], "rb") as f:
                self.set_roidb(pickle.load(f))
        if "scale" in params:  # cfg_from_file's effect, for runs with no script to set it
            cfg.TRAIN.SCALES = (params["scale"],)
            cfg.TRAIN.MAX_SIZE = params.get("max_size", params["scale"])
        # the largest image the config allows, as the original (1, 3, 600, 1000 by default)
        top[0].reshape(1, 3, max(cfg.TRAIN.SCALES), cfg.TRAIN.MAX_SIZE)
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
        gt = np.hstack([entry["boxes"], entry["gt_classes"][:, None]])
        blobs = (im.transpose(2, 0, 1)[None], np.array([[im.shape[0], im.shape[1], 1.0]]), gt)
        for top_blob, blob in zip(top, blobs):  # each image's own shapes, as the original
            top_blob.reshape(*blob.shape)
            top_blob.data[...] = blob.astype(np.float32, copy=False)

    def backward(self, top, propagate_down, bottom):
        pass

    def reshape(self, bottom, top):
        pass
