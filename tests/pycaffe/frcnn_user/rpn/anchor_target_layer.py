"""An AnchorTargetLayer in py-faster-rcnn's interface, in numpy (npr.choice subsampling)."""

import numpy as np
import numpy.random as npr
import yaml

import caffe2jax as caffe
from rpn.generate_anchors import generate_anchors


def _overlaps(b, q):
    iw = np.minimum(b[:, None, 2], q[None, :, 2]) - np.maximum(b[:, None, 0], q[None, :, 0]) + 1
    ih = np.minimum(b[:, None, 3], q[None, :, 3]) - np.maximum(b[:, None, 1], q[None, :, 1]) + 1
    area = lambda x: (x[:, 2] - x[:, 0] + 1) * (x[:, 3] - x[:, 1] + 1)  # noqa: E731
    inter = np.where((iw > 0) & (ih > 0), iw * ih, 0.0)
    return inter / (area(b)[:, None] + area(q)[None, :] - inter)


def _targets(ex, gt):
    ew, eh = ex[:, 2] - ex[:, 0] + 1.0, ex[:, 3] - ex[:, 1] + 1.0
    gw, gh = gt[:, 2] - gt[:, 0] + 1.0, gt[:, 3] - gt[:, 1] + 1.0
    dx = (gt[:, 0] + 0.5 * gw - ex[:, 0] - 0.5 * ew) / ew
    dy = (gt[:, 1] + 0.5 * gh - ex[:, 1] - 0.5 * eh) / eh
    return np.stack([dx, dy, np.log(gw / ew), np.log(gh / eh)], 1)


class AnchorTargetLayer(caffe.Layer):
    def setup(self, bottom, top):
        params = yaml.load(self.param_str_, Loader=yaml.Loader)
        self._anchors = generate_anchors(scales=np.array(params.get("scales", (8, 16, 32))))
        self._feat_stride = params["feat_stride"]
        a = len(self._anchors)
        height, width = bottom[0].data.shape[-2:]
        top[0].reshape(1, 1, a * height, width)
        for i in (1, 2, 3):
            top[i].reshape(1, 4 * a, height, width)

    def forward(self, bottom, top):
        height, width = bottom[0].data.shape[-2:]
        gt, info = bottom[1].data, bottom[2].data[0]
        sx, sy = np.meshgrid(
            np.arange(width) * self._feat_stride, np.arange(height) * self._feat_stride
        )
        shifts = np.vstack((sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel())).T
        a = len(self._anchors)
        allb = (self._anchors[None] + shifts[:, None]).reshape(-1, 4)
        inds = np.where(
            (allb[:, 0] >= 0) & (allb[:, 1] >= 0) & (allb[:, 2] < info[1]) & (allb[:, 3] < info[0])
        )[0]
        anchors = allb[inds]
        ov = _overlaps(anchors, gt[:, :4])
        arg = ov.argmax(1)
        mx = ov[np.arange(len(inds)), arg]
        best = np.where(ov == ov.max(0))[0]
        labels = np.full(len(inds), -1.0)
        labels[mx < 0.3] = 0
        labels[best] = 1
        labels[mx >= 0.7] = 1
        fg = np.where(labels == 1)[0]
        if len(fg) > 128:
            labels[npr.choice(fg, size=len(fg) - 128, replace=False)] = -1
        bg = np.where(labels == 0)[0]
        num_bg = 256 - np.sum(labels == 1)
        if len(bg) > num_bg:
            labels[npr.choice(bg, size=len(bg) - num_bg, replace=False)] = -1
        w_in = np.zeros((len(inds), 4))
        w_in[labels == 1] = 1
        w_out = np.zeros((len(inds), 4))
        w_out[labels >= 0] = 1.0 / max(np.sum(labels >= 0), 1)

        def unmap(x, fill):
            out = np.full((len(allb),) + x.shape[1:], fill, np.float32)
            out[inds] = x
            return out

        lab = unmap(labels, -1).reshape(1, height, width, a).transpose(0, 3, 1, 2)
        tops = [lab.reshape(1, 1, a * height, width)]
        for x in (_targets(anchors, gt[arg]), w_in, w_out):
            tops.append(unmap(x, 0).reshape(1, height, width, 4 * a).transpose(0, 3, 1, 2))
        for blob, value in zip(top, tops):  # the original reshapes its tops here
            blob.reshape(*value.shape)
            blob.data[...] = value

    def backward(self, top, propagate_down, bottom):
        pass

    def reshape(self, bottom, top):
        pass
