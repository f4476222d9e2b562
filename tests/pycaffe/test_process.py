"""caffe.proto, layer_type_list, Timer, init_log/log and the single-process solver names."""

from __future__ import annotations

import logging
import time

import pytest

import caffe2jax as caffe
from caffe2jax.frontend import caffe_pb2 as generated
from caffe2jax.frontend.errors import CaffeError


def test_proto_is_the_one_generated_module():
    import caffe2jax.proto.caffe_pb2 as by_path
    from caffe2jax.proto import caffe_pb2

    assert caffe_pb2 is generated and by_path is generated
    assert caffe.proto.caffe_pb2 is generated
    assert isinstance(caffe_pb2.NetParameter(), generated.NetParameter)
    assert caffe.TRAIN == caffe_pb2.TRAIN and caffe.TEST == caffe_pb2.TEST


def test_layer_type_list_is_sorted_and_complete():
    types = caffe.layer_type_list()
    assert types == sorted(types)
    assert {"Convolution", "Python", "SoftmaxWithLoss", "Data", "LSTM"} <= set(types)


def test_timer_measures_milliseconds():
    timer = caffe.Timer()
    assert timer.ms == 0.0  # never run: Caffe warns and reads 0
    timer.start()
    time.sleep(0.02)
    timer.stop()
    first = timer.ms
    assert 15 <= first < 2000
    assert timer.ms == first  # stopped: reading again does not move
    timer.start()
    assert timer.ms < first + 2000  # reading while running stops it


def test_init_log_and_log_write_caffe_lines(capsys):
    caffe.init_log(0, True)
    caffe.log("hello from a script")
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("I") and line.endswith("] hello from a script")
    caffe.init_log(2)
    caffe.log("not shown at ERROR level")
    assert "not shown" not in capsys.readouterr().err
    logging.getLogger("caffe2jax").setLevel(logging.INFO)
    with pytest.raises(CaffeError, match="0 \\(INFO\\) to 3"):
        caffe.init_log(7)


def test_single_process_values():
    assert caffe.has_nccl() is False
    assert caffe.solver_count() == 1 and caffe.solver_rank() == 0
    for setter in (caffe.set_multiprocess, caffe.set_solver_count, caffe.set_solver_rank):
        with pytest.raises(CaffeError, match="--gpu"):  # names what to use instead
            setter(1)
