"""py-faster-rcnn's end-to-end train net (/work/shared/forks/models/faster_rcnn_vgg16_train
.prototxt: its layer graph, param_strs and Python layers, the widths shrunk by the test)
through the USER's own Python layers — tests/pycaffe/frcnn_user's ProposalLayer (config by
``cfg[str(self.phase)]``, NMS, ``top[0].reshape(n, 5)`` in forward) and ProposalTargetLayer
(tops reshaped to the rois it draws) — instead of caffe2jax's built-ins: in pycaffe's
``solver.step`` and ``Net.forward`` and the CLI's ``train`` and ``test``. Where both are
deterministic the user's proposals and the RPN losses equal the built-ins'; the layers after
the proposal layer run at the counts it gives."""

from __future__ import annotations

import pickle
import re
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

import caffe2jax as caffe
from examples.detection.synthetic_boxes import make_image
from tests.cli_runner import run_cli

pytestmark = pytest.mark.heavy  # about 4 minutes on 2 cores (pytest -m heavy)

SHARED = Path("/work/shared") if Path("/work/shared").exists() else Path("../shared")
TRAIN_NET = SHARED / "forks/models/faster_rcnn_vgg16_train.prototxt"
USER = Path(__file__).parent / "frcnn_user"
MODULES = ("rpn", "roi_data_layer", "fast_rcnn")
SIZE = 160  # the images' side: the default anchors (128–512 px) need room
# VGG16's widths shrunk (64…512 → 4, fc 4096 → 16); RPN's 18/36 and the heads' 21/84 kept
WIDTHS = {64: 4, 128: 4, 256: 4, 512: 4, 4096: 16}


def _forget_modules() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] in MODULES]:
        del sys.modules[name]


@pytest.fixture
def checkout(tmp_path):
    """A copy of the user's checkout on sys.path (``without`` modules removed, for the
    built-ins to stand in), as tools/_init_paths.py puts lib/ there; the config set for
    SIZE-pixel images (cfg.TRAIN.SCALES, MAX_SIZE)."""
    made = []

    def make(without: tuple[str, ...] = ()) -> Path:
        _forget_modules()
        while made:
            sys.path.remove(made.pop())
        folder = tmp_path / f"lib{len(list(tmp_path.glob('lib*')))}"
        shutil.copytree(USER, folder)
        for module in without:
            (folder / f"{module.replace('.', '/')}.py").unlink()
        sys.path.insert(0, str(folder))
        made.append(str(folder))
        from fast_rcnn.config import cfg

        cfg.TRAIN.SCALES, cfg.TRAIN.MAX_SIZE = (SIZE,), SIZE
        return folder

    yield make
    for path in made:
        sys.path.remove(path)
    _forget_modules()


def shrunk_net(folder: Path, roidb: Path | None = None) -> Path:
    """The fork's train prototxt with VGG's widths shrunk (WIDTHS); ``roidb`` (a pickle) given
    to the data layer's param_str for runs without a script."""
    text = TRAIN_NET.read_text()  # fails, not skips, when the oracle is missing
    text = re.sub(r"num_output: (\d+)", lambda m: f"num_output: {WIDTHS.get(int(m[1]), m[1])}",
                  text)  # fmt: skip
    if roidb is not None:
        given = f"'num_classes': 21\\n'roidb': '{roidb}'\\n'scale': {SIZE}"
        text = text.replace("param_str: \"'num_classes': 21\"\n  }\n}\n",
                            f'param_str: "{given}"\n  }}\n}}\n', 1)  # fmt: skip
        assert f"'roidb': '{roidb}'" in text
    path = folder / "train.prototxt"
    path.write_text(text)
    return path


def roidb(folder: Path, count: int) -> list[dict]:
    """A roidb of ``count`` synthetic SIZE-pixel images (1–3 boxes of classes 1–3 each)."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(count):
        chw, boxes, labels = make_image(rng, SIZE)
        path = folder / f"{i}.png"
        cv2.imwrite(str(path), chw.transpose(1, 2, 0))
        out.append({"image": str(path), "boxes": boxes.astype(np.float32),
                    "gt_classes": labels.astype(np.int32), "flipped": False})  # fmt: skip
    return out


def solver_file(folder: Path, net: Path, **extra) -> Path:
    fields = "".join(f"{k}: {v}\n" for k, v in extra.items())
    path = folder / "solver.prototxt"
    path.write_text(
        f'train_net: "{net}"\nbase_lr: 0.001\nlr_policy: "fixed"\nmomentum: 0.9\n'
        f"weight_decay: 0.0005\ndisplay: 1\nsnapshot: 0\nrandom_seed: 5\n{fields}"
    )
    return path


# -- pycaffe ------------------------------------------------------------------------------------


def test_solver_step_runs_the_users_layers_at_their_counts(tmp_path, checkout):
    folder = checkout()
    solver = caffe.SGDSolver(str(solver_file(tmp_path, shrunk_net(folder))))
    np.random.seed(3)
    solver.net.layers[0].set_roidb(roidb(tmp_path, 3))
    import rpn.proposal_layer as proposal
    import rpn.proposal_target_layer as target

    losses = []
    for _ in range(1):  # each new count compiles the whole step (about a minute on 2 cores)
        solver.step(1)
        blobs = solver.net.blobs
        losses.append([float(blobs[b].data) for b in
                       ("rpn_cls_loss", "rpn_loss_bbox", "loss_cls", "loss_bbox")])  # fmt: skip
        n = proposal.forwards[-1][1]
        given, rois, fg = target.forwards[-1]
        gt = blobs["gt_boxes"].data.shape[0]
        # the layers after the proposal layer ran at its count, and after the target layer at
        # the rois it drew
        assert blobs["rpn_rois"].data.shape == (n, 5) and given == n
        assert rois == min(128, n + gt) and 0 < fg <= 32
        assert blobs["rois"].data.shape == (rois, 5) and blobs["labels"].data.shape == (rois,)
        assert blobs["pool5"].data.shape[0] == rois and blobs["cls_score"].data.shape == (rois, 21)
        assert blobs["bbox_pred"].data.shape == (rois, 84)
    assert [phase for phase, _ in proposal.forwards] == ["TRAIN"]  # cfg['TRAIN'] read
    assert solver.iter == 1 and np.isfinite(losses).all(), losses


def _test_forwards(net, count: int) -> list[dict]:
    """``count`` forwards, numpy's seed set before each (the anchor target layer's draws).
    The blobs read are asked for in ``forward(blobs=...)``, as a pycaffe script may: the
    forward returns them (reading a blob it did not return would compile a second forward)."""
    out, wanted = [], ["rpn_rois", "rpn_cls_loss", "rpn_loss_bbox", "loss_cls"]
    for i in range(count):
        np.random.seed(20 + i)
        net.forward(blobs=wanted)
        out.append({k: np.array(net.blobs[k].data) for k in wanted})
    return out


def test_users_proposals_equal_the_builtins(tmp_path, checkout):
    """TEST phase (cfg['TEST']: 6000 / 300 / 0.7 / 16), same weights and images: the user's
    proposals are the built-in's kept rows (the built-in pads with zero rows to a fixed
    count), and the losses that do not depend on the random roi draws are equal."""
    folder = checkout()
    images = roidb(tmp_path, 2)
    net = caffe.Net(str(shrunk_net(folder)), caffe.TEST)
    net.save(str(tmp_path / "w.caffemodel"))
    np.random.seed(3)
    net.layers[0].set_roidb(images)
    import rpn.proposal_layer as proposal

    # one forward each side: every new proposal count compiles the whole net again (the
    # programs of nets with Python layers are not kept in JAX's persistent cache)
    user = _test_forwards(net, 1)
    assert [phase for phase, _ in proposal.forwards] == ["TEST"]
    counts = [len(run["rpn_rois"]) for run in user]
    assert 1 < min(counts) and max(counts) < 300, counts  # not setup's (1, 5), not padded

    folder = checkout(without=("rpn.proposal_layer", "rpn.proposal_target_layer"))
    net = caffe.Net(str(shrunk_net(folder)), caffe.TEST, weights=str(tmp_path / "w.caffemodel"))
    np.random.seed(3)
    net.layers[0].set_roidb(images)
    builtin = _test_forwards(net, 1)
    assert len(proposal.forwards) == 1  # the user's layer ran no more: the built-in did
    for mine, theirs, n in zip(user, builtin, counts):
        assert theirs["rpn_rois"].shape == (300, 5)
        # float32 boxes on both sides; exp and the decode may round differently by an ulp
        np.testing.assert_allclose(mine["rpn_rois"], theirs["rpn_rois"][:n], rtol=1e-5, atol=1e-3)
        assert not theirs["rpn_rois"][n:].any()
        for key in ("rpn_cls_loss", "rpn_loss_bbox"):
            np.testing.assert_allclose(mine[key], theirs[key], rtol=1e-5)
        assert np.isfinite(mine["loss_cls"])


# -- the CLI ------------------------------------------------------------------------------------


def test_cli_train_and_test_run_the_users_layers(tmp_path, checkout, monkeypatch):
    folder = checkout()
    with open(tmp_path / "roidb.pkl", "wb") as f:
        pickle.dump(roidb(tmp_path, 2), f)
    net = shrunk_net(folder, tmp_path / "roidb.pkl")
    solver = solver_file(tmp_path, net, max_iter=1, snapshot_after_train="true",
                         snapshot_prefix=f'"{tmp_path / "frcnn"}"')  # fmt: skip
    log = tmp_path / "proposals.log"
    monkeypatch.setenv("PYTHONPATH", f"{folder}:{Path.cwd()}")
    monkeypatch.setenv("FRCNN_USER_LOG", str(log))
    done = run_cli("train", "--solver", solver, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    losses = [float(v) for v in re.findall(r"Iteration \d+ \(.*\), loss = (\S+)", done.stderr)]
    assert len(losses) == 1 and np.isfinite(losses).all(), done.stderr[-2000:]
    trained = log.read_text().split()
    # the user's layer read cfg['TRAIN'] (the iteration, then Solve's last forward)
    assert trained[::2] == ["TRAIN", "TRAIN"], trained
    log.unlink()
    done = run_cli("test", "--model", net, "--weights", tmp_path / "frcnn_iter_1.caffemodel",
                   "--iterations", "1", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    tested = log.read_text().split()
    assert tested[::2] == ["TEST"], tested
    batches = re.findall(r"Batch \d+, loss_cls = (\S+)", done.stderr)
    assert len(batches) == 1 and np.isfinite([float(v) for v in batches]).all()
