"""The command line: Caffe-shaped commands, and one clear line (no traceback) on bad input."""

from __future__ import annotations

import re

import pytest

from tests.cli_runner import run_cli
from tests.golden import GOLDEN, MODELS, ROOT

DIGITS = ROOT / "examples" / "digits"


def cli(*args, cwd=None, check=True):
    proc = run_cli(*args, cwd=cwd)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_version_and_help():
    assert cli("--version").stdout.startswith("caffe2jax ")
    out = cli("--help").stdout
    for command in ("train", "test", "summary", "upgrade", "convert_imageset", "export"):
        assert command in out


def test_summary_prints_caffes_setup_lines():
    out = cli("summary", GOLDEN / "nets" / "lenet_deploy.prototxt").stdout
    assert "Top shape: 2 20 24 24 (23040)" in out
    assert "This network produces output prob" in out
    assert re.search(r"Memory required for data: \d+", out)


SHARED_MISMATCH = """
layer { name: "in" type: "Input" top: "a" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "a" top: "y1"
        param { name: "w" } inner_product_param { num_output: 2 } }
layer { name: "ip2" type: "InnerProduct" bottom: "a" top: "y2"
        param { name: "w" } inner_product_param { num_output: 4 } }
"""
BAD_NETS = {
    "truncated": ('name: "x"\nlayer {\n  name: "a"\n  type: "Input"\n', r"bad\.prototxt:\d+:\d+"),
    "unknown field": (
        'layer { name: "a" tpye: "ReLU" }',
        r"bad\.prototxt:1:\d+: layer 'a': unknown .*'tpye' .*did you mean 'type'",
    ),
    "wrong type": ('layer { name: "a" convolution_param { num_output: "x" } }', r":1:\d+:"),
    "undefined bottom": (
        'layer { name: "r" type: "ReLU" bottom: "nowhere" top: "r" }',
        r"bad\.prototxt:1: layer 'r' \(type ReLU\): unknown bottom blob 'nowhere'",
    ),
    "shared param shape": (SHARED_MISMATCH, r"cannot share param 'w'.*\[2, 3\].*\[4, 3\]"),
}


@pytest.mark.parametrize("case", sorted(BAD_NETS))
def test_bad_nets_give_one_line_and_exit_1(case, tmp_path):
    text, pattern = BAD_NETS[case]
    path = tmp_path / "bad.prototxt"
    path.write_text(text)
    proc = cli("summary", path, check=False)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(pattern, lines[0]), lines[0]


def test_upgrade_writes_current_format_and_never_overwrites(tmp_path):
    v1 = tmp_path / "v1.prototxt"
    v1.write_text(
        'input: "data" input_dim: 1 input_dim: 1 input_dim: 4 input_dim: 4\n'
        'layers { name: "relu" type: RELU bottom: "data" top: "data" }\n'
    )
    out = tmp_path / "v2.prototxt"
    cli("upgrade", v1, out)
    text = out.read_text()
    assert 'type: "ReLU"' in text and 'type: "Input"' in text and "layers" not in text
    proc = cli("upgrade", v1, out, check=False)
    assert proc.returncode == 1 and "already exists" in proc.stderr
    assert out.read_text() == text


def test_upgrade_solver_type(tmp_path):
    old = tmp_path / "solver.prototxt"
    old.write_text('net: "net.prototxt" base_lr: 0.1 solver_type: ADAM\n')
    cli("upgrade", old, tmp_path / "new.prototxt")
    assert 'type: "Adam"' in (tmp_path / "new.prototxt").read_text()


def test_train_and_test_the_digits_example(tmp_path):
    """The README's main job, shortened for CI: 500 of its 1500 iterations (a multiple of
    test_interval, so the last test runs) and a looser bar (the full run reaches ≥ 95 %)."""
    proc = cli("train", "--solver", DIGITS / "lenet_solver.prototxt", "--iterations", 500,
               "--progress", "log", cwd=tmp_path)  # fmt: skip
    log = (tmp_path / "lenet_solver.log").read_text()
    assert log == proc.stderr.replace("\r", "") or "Iteration 0" in proc.stderr
    assert re.search(r"Iteration 100 \([\d.e+-]+ iter/s, [\d.e+-]+s/100 iters\), loss = ", log)
    assert "Iteration 100, lr = " in log and "Optimization Done." in log
    scores = re.findall(r"Test net output #0: accuracy = ([\d.]+)", log)
    assert len(scores) == 2 and float(scores[-1]) >= 0.9, scores
    weights = tmp_path / "lenet_digits_iter_500.caffemodel"
    assert weights.exists() and (tmp_path / "lenet_digits_iter_500.solverstate").exists()
    out = cli("test", "--model", DIGITS / "lenet_train_test.prototxt", "--weights", weights,
              "--iterations", 3, cwd=tmp_path).stderr  # fmt: skip
    assert re.search(r"\] accuracy = 0\.9\d+", out) and "Loss: " in out


def test_train_refuses_weights_with_snapshot(tmp_path):
    proc = cli("train", "--solver", DIGITS / "lenet_solver.prototxt", "--weights", "a",
               "--snapshot", "b", check=False)  # fmt: skip
    assert proc.returncode == 2 and "not allowed with" in proc.stderr


def test_train_bad_solver_is_one_line(tmp_path):
    path = tmp_path / "solver.prototxt"
    path.write_text(f'net: "{MODELS / "examples/mnist/lenet_train_test.prototxt"}" type: "Fast"')
    proc = cli("train", "--solver", path, cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "unknown solver type 'Fast'; known: SGD, Nesterov, AdaGrad, RMSProp, AdaDelta, Adam"
        )
    )


def test_draw_writes_graphviz_source(tmp_path):
    out = tmp_path / "lenet.dot"
    cli("draw", MODELS / "examples/mnist/lenet_train_test.prototxt", out)
    dot = out.read_text()
    assert dot.startswith("digraph LeNet") and "conv1_Convolution -> conv1_blob" in dot
    assert "data_blob -> conv1_Convolution" in dot
