"""examples/segmentation/segnet_basic.py, shortened: SegNet-Tutorial's segnet_basic_train
.prototxt (from ../shared, rewritten only in list path, batch size and class count) trained by
`caffe2jax train` on a tiny synthetic set, the loss falling, and a run resumed from its
snapshot ending with the very same weights. (The full run — 400 iterations, compute_bn_stats,
segment, pixel accuracy — is the example itself.)"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from caffe2jax.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "segmentation" / "segnet_basic.py"


def _example():
    spec = importlib.util.spec_from_file_location("segnet_basic_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _losses(log: Path) -> dict[int, float]:
    found = re.findall(r"Iteration (\d+) \([^)]*\), loss = ([\d.e+-]+)", log.read_text())
    return {int(i): float(v) for i, v in found}


def test_segnet_basic_learns_and_resumes_exactly(tmp_path):
    ex = _example()
    assert ex.TRAIN_PROTOTXT.is_file(), f"missing {ex.TRAIN_PROTOTXT}"
    # 24×32: H/8 odd, as the net's pad_out_h needs (CamVid's 360×480 has 45)
    data = ex.make_segmentation.build(tmp_path / "data", 8, 0, 24, 32)
    weights = [float(w) for w in (data / "class_weighting.txt").read_text().split()]
    net = tmp_path / "train.prototxt"
    net.write_text(ex.train_prototxt(ex.TRAIN_PROTOTXT.read_text(), data / "train.txt", 2, weights))
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        text = ex.solver_prototxt(net, tmp_path / name / "segnet", 12, 6).replace(
            "display: 20", "display: 1"
        )
        (tmp_path / f"{name}.prototxt").write_text(text)
    solver = str(tmp_path / "a.prototxt")
    assert main(["train", "--solver", solver, "--log", str(tmp_path / "a.log")]) == 0
    losses = _losses(tmp_path / "a.log")
    assert sum(losses[i] for i in (9, 10, 11)) < 0.6 * sum(losses[i] for i in (0, 1, 2)), losses
    state = tmp_path / "a" / "segnet_iter_6.solverstate"
    argv = ["train", "--solver", str(tmp_path / "b.prototxt"), "--snapshot", str(state)]
    assert main([*argv, "--log", str(tmp_path / "b.log")]) == 0
    resumed = _losses(tmp_path / "b.log")
    assert all(resumed[i] == losses[i] for i in range(7, 12)), (losses, resumed)
    final = "segnet_iter_12.caffemodel"
    assert (tmp_path / "a" / final).read_bytes() == (tmp_path / "b" / final).read_bytes()
