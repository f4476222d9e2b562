"""The jitted train step (runtime/train/step.py) on batches whose label top is sized per batch:
SSD's AnnotatedData pads each batch's label to its own bucket of rows, not the worst
record's (issue 37). The loss and every gradient are the same bits at the batch's bucket and
at the worst-record padding (jitted, inside value_and_grad, and through the whole step);
the step compiles once per bucket met; iter_size passes share one shape; pycaffe's forward
shows each batch's label at its bucket."""

from __future__ import annotations

import jax
import numpy as np

from caffe2jax.runtime.train.loop import SolverLoop
from caffe2jax.runtime.train.state import train_step
from caffe2jax.runtime.train.step import Trainer
from tests.runtime.train.annotated_buckets import make

WORST = 2 + 300  # G: the 300-box record and a 2-box one


def _bits(tree) -> list[bytes]:
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


def _padded(loop: SolverLoop, inputs: dict) -> dict:
    source = loop.train.feeder.sources["data"]
    data, label = source.pad_to([inputs["data"], inputs["label"]], source.top_shapes())
    return {**inputs, "data": data, "label": label}


def test_loss_and_gradients_are_the_same_bits_at_any_bucket(tmp_path):
    loop = SolverLoop(make(tmp_path))
    try:
        inputs = loop.train.next_inputs()  # records 0 and 1: 4 boxes, the 8-row bucket
        worst = _padded(loop, inputs)
        assert inputs["label"].shape == (1, 1, 8, 8) and worst["label"].shape == (1, 1, WORST, 8)
        ts, rng = loop.ts, jax.random.key(7)
        results = []
        for feed in (inputs, worst):
            model = loop.train.member(feed)
            grad = jax.jit(jax.value_and_grad(model.loss, has_aux=True))
            (loss, _), grads = grad(ts.params, ts.state, feed, rng)
            fresh = ts.replace(opt_state=Trainer.own_buffers(ts.opt_state))  # the step donates it
            after, step_loss, _, _ = train_step(loop.trainer, fresh, [feed])
            results.append((_bits(loss), _bits(grads), _bits(after.params), _bits(step_loss)))
            assert np.isfinite(float(loss)) and float(loss) > 0
        assert results[0] == results[1]
    finally:
        loop.close()


def test_the_step_compiles_once_per_bucket(tmp_path):
    """Eight iterations over buckets 8, 302, 8, 8, 8, 302, 8, 8: two step programs (the
    worst batch's is the net's own shape), and the label each pass saw at its bucket."""
    loop = SolverLoop(make(tmp_path))
    try:
        rows = []
        for _ in range(8):
            loop.step(1)
            rows.append(loop.last_pass.inputs["label"].shape[2])
        assert rows == [8, WORST, 8, 8] * 2
        assert loop.trainer.traces == 2
        assert np.isfinite(loop.smoothed_loss)
    finally:
        loop.close()


def test_iter_size_passes_share_one_shape(tmp_path):
    """iter_size 2: the passes of an iteration are padded to the larger bucket of the two
    (one step program per pair of buckets would otherwise compile)."""
    loop = SolverLoop(make(tmp_path, iter_size=2))
    try:
        seen = []
        for _ in range(4):
            passes = [loop.train.next_inputs() for _ in range(2)]
            seen.append([p["label"].shape[2] for p in loop.train.feeder.padded_alike(passes)])
        assert seen == [[WORST, WORST], [8, 8]] * 2
        loop.step(4)
        assert loop.trainer.traces == 2 and np.isfinite(loop.smoothed_loss)
    finally:
        loop.close()


def test_pycaffe_forward_shows_each_batch_at_its_bucket(tmp_path):
    import caffe2jax as caffe

    make(tmp_path)
    net = caffe.Net(str(tmp_path / "train.prototxt"), caffe.TRAIN)
    try:
        shapes, losses = [], []
        for _ in range(4):
            losses.append(float(net.forward()["mbox_loss"]))
            shapes.append(net.blobs["label"].shape)
        assert shapes == [(1, 1, 8, 8), (1, 1, WORST, 8), (1, 1, 8, 8), (1, 1, 8, 8)]
        assert np.isfinite(losses).all()
        real = net.blobs["label"].data[0, 0]
        assert (real[:4, 0] >= 0).all() and (real[4:] == -1).all()
    finally:
        net.close()
