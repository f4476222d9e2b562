"""caffe.draw (pydot) and `caffe2jax draw`. Rendering needs Graphviz's `dot` program: where it
is missing, the rendering tests check the DOT source instead (pydot alone makes it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import caffe2jax.pycaffe.draw as draw
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.frontend.pipeline import load_param
from caffe2jax.proto import caffe_pb2
from tests.cli_runner import run_cli

MODELS = Path(__file__).resolve().parents[2].parent / "shared/caffe/models"
LENET = MODELS / "examples/mnist/lenet_train_test.prototxt"
GOOGLENET = MODELS / "models/bvlc_googlenet/train_val.prototxt"
HAVE_DOT = shutil.which("dot") is not None


def test_graph_nodes_labels_and_edges():
    net = load_param(LENET)
    text = draw.get_pydot_graph(net, "LR").to_string()
    assert text.startswith("digraph LeNet {") and "rankdir=LR" in text
    assert 'conv1_Convolution [label="conv1\\n(Convolution)\\nkernel size: 5\\nstride: 1' in text
    assert 'fillcolor="#FF5050"' in text  # convolutions are red
    assert 'pool1_Pooling [label="pool1\\n(Pooling)\\npool type: MAX\\nkernel size: 2' in text
    assert 'relu1_ReLU [label="relu1\\n(ReLU)", shape=record, fillcolor="#90EE90"' in text
    assert "conv1_Convolution -> conv1_blob [label=20]" in text
    assert 'mnist_Data -> data_blob [label="Batch 100"]' in text  # the TEST layer comes last
    assert "data_blob -> conv1_Convolution;" in text


def test_phase_rankdir_and_learning_rate_multipliers():
    net = load_param(LENET)
    train = draw.get_pydot_graph(net, "TB", phase=caffe_pb2.TRAIN, display_lrm=True).to_string()
    assert "accuracy_Accuracy" not in train and 'label="Batch 64"' in train
    label = "conv1 (Convolution) kernel size: 5 stride: 1 pad: 0 lr mult: 1.00, 2.00"
    assert f'label="{label}"' in train
    test = draw.get_pydot_graph(net, "LR", phase=caffe_pb2.TEST).to_string()
    assert "accuracy_Accuracy" in test and "Batch 64" not in test
    bad = caffe_pb2.NetParameter()
    layer = bad.layer.add(name="x", type="ReLU")
    layer.include.add(phase=caffe_pb2.TRAIN)
    layer.exclude.add(phase=caffe_pb2.TEST)
    with pytest.raises(ValueError, match="both include and exclude"):
        draw.get_pydot_graph(bad, "LR", phase=caffe_pb2.TRAIN)


def test_cli_draws_googlenet(tmp_path):
    """A PNG of GoogLeNet where Graphviz is installed; its DOT source otherwise."""
    out = tmp_path / ("googlenet.png" if HAVE_DOT else "googlenet.dot")
    done = run_cli("draw", GOOGLENET, out, "--phase", "TRAIN")
    assert done.returncode == 0, done.stderr
    data = out.read_bytes()
    if HAVE_DOT:
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 100_000
    else:
        text = data.decode()
        assert '"inception_5b/output_Concat"' in text and "loss3/classifier" in text


def test_cli_keeps_existing_files_without_force(tmp_path):
    out = tmp_path / "lenet.dot"
    out.write_text("mine")
    done = run_cli("draw", LENET, out)
    assert done.returncode == 1 and out.read_text() == "mine"
    assert done.stderr.strip().endswith("already exists; not overwriting it (use --force)")
    assert run_cli("draw", LENET, out, "--force").returncode == 0
    assert out.read_text().startswith("digraph LeNet")
    done = run_cli("draw", LENET, tmp_path / "lenet.jpeg2")
    assert done.returncode == 1 and "unknown output type" in done.stderr


def test_draw_net_renders_svg_and_pdf(tmp_path):
    """With Graphviz: SVG and PDF bytes. Without: one clear error naming the missing program."""
    net = load_param(LENET)
    if not HAVE_DOT:
        with pytest.raises(CaffeError, match="needs Graphviz's 'dot' program"):
            draw.draw_net(net, "LR", ext="svg")
        return
    assert draw.draw_net(net, "LR", ext="svg").lstrip().startswith(b"<?xml")
    draw.draw_net_to_file(net, tmp_path / "lenet.pdf", phase=caffe_pb2.TEST)
    assert (tmp_path / "lenet.pdf").read_bytes().startswith(b"%PDF")
