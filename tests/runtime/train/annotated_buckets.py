"""A small SSD (examples/detection/small_ssd.py) trained on an AnnotatedData LMDB whose fourth
record holds many boxes and the others two: the nets and solver of the label-bucket tests
(tests/runtime/train/test_step.py, tests/runtime/parallel/test_data_parallel.py). Run as a
module (``python -m tests.runtime.train.annotated_buckets WORK``, in a process whose JAX sees
two devices) it prints one JSON object: two devices against one with iter_size 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from examples.detection.small_ssd import BODY, DATA, LOSS, SIZE
from tests.runtime.data.helpers import write_annotated_db

COUNTS = [2, 2, 2, 300, 2, 2, 2, 2]  # batch 2: label buckets 8, 302 (G), 8, 8
SOLVER = """train_net: "{work}/train.prototxt" base_lr: 0.01 lr_policy: "fixed" type: "SGD"
momentum: 0.9 display: 0 max_iter: 100 random_seed: 3 iter_size: {iter_size}
{test}"""
TEST = 'test_net: "{work}/test.prototxt" test_iter: 4 test_interval: 2 test_initialization: false'


def make(work: Path, batch: int = 2, iter_size: int = 1, test: bool = False) -> Path:
    """The LMDB (once), the nets and a solver in ``work``; returns the solver's path."""
    work.mkdir(parents=True, exist_ok=True)
    db = work / "db"
    if not db.exists():
        write_annotated_db(db, COUNTS, size=SIZE, seed=1)
    for phase in ("TRAIN", "TEST"):
        data = DATA.format(phase=phase, transform="", interp="", source=db, batch=batch,
                           samplers="", size=SIZE, labelmap="unused")  # fmt: skip
        (work / f"{phase.lower()}.prototxt").write_text(data + BODY + LOSS)
    solver = work / f"solver_{iter_size}.prototxt"
    solver.write_text(SOLVER.format(work=work, iter_size=iter_size,
                                    test=TEST.format(work=work) if test else ""))  # fmt: skip
    return solver


def _run(solver: Path, devices: str | None) -> tuple[dict, list[float]]:
    from caffe2jax.runtime.train.loop import SolverLoop

    loop = SolverLoop(solver, devices=devices)
    try:
        loop.step(4)  # two test passes on the way
        scores = loop.test(0)
        params = {f"{k}/{j}": np.asarray(v) for k, blobs in loop.ts.params.items()
                  for j, v in enumerate(blobs) if v is not None}  # fmt: skip
        return params, [scores["mbox_loss"]]
    finally:
        loop.close()


def main(work: Path) -> None:
    mesh, mesh_scores = _run(make(work, test=True), "0,1")
    one, one_scores = _run(make(work, iter_size=2, test=True), None)
    diff = max(float(np.max(np.abs(mesh[k] - one[k]))) for k in one)
    print(json.dumps({"params": diff, "test": abs(mesh_scores[0] - one_scores[0]),
                      "loss": one_scores[0]}))  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
