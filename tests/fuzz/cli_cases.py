"""Fuzz cases for every verb of the ``caffe2jax`` command line, run in the worker as a user
runs them (``main(argv)``), with hostile arguments: files of the wrong kind, missing, too
long, under /proc; extreme numbers; damaged nets, weights, solver states, lists and logs.

A case passes when the command succeeds, or fails with status 1 or 2 and its last line of
stderr is ``caffe2jax <verb>: error: <one short line>`` (argparse's usage lines may precede
it); a traceback or any other ending is a finding.
"""

from __future__ import annotations

import contextlib
import io
import logging
import random
import shutil
from pathlib import Path

from caffe2jax.frontend.errors import CaffeError
from tests.fuzz.images import hostile_image, valid
from tests.fuzz.mutate import mutate_bytes, mutate_text

# an iteration count a user can mean (a valid 2^31 - 1 is honoured, as Caffe honours it: not
# a case that can end within a case's time limit) or one that is not a count at all
COUNTS = ["0", "1", "2", "-1", "2147483648", "-2147483649", "100000000000000000000", "nan",
          "abc", "", "1e3"]  # fmt: skip
NUMBERS = ["0", "1", "2", "-1", "2147483647", "2147483648", "-2147483648", "100000000000000000000",
           "nan", "abc", ""]  # fmt: skip
MAX_LINE = 360  # the runner's MAX_MESSAGE and the "caffe2jax <verb>: error: " prefix


def bad_path(rng: random.Random, work: Path) -> str:
    return rng.choice([
        "", "missing.file", "x" * 300, "/proc/self/mem", "/proc/self/x/y", "/dev/zero", "/",
        str(work), str(work / ("y" * 250) / "z"), "/etc/passwd",
    ])  # fmt: skip


def _pick(rng: random.Random, good: str, work: Path, p: float = 0.2) -> str:
    return bad_path(rng, work) if rng.random() < p else good


def _number(rng: random.Random, good: str, p: float = 0.2, pool: list[str] = NUMBERS) -> str:
    return rng.choice(pool) if rng.random() < p else good


def _mutated(rng: random.Random, work: Path, name: str, data: bytes, text: bool) -> str:
    path = work / name
    if rng.random() < 0.5:
        path.write_bytes(data)
    elif text:
        path.write_bytes(mutate_text(rng, data.decode()).encode("utf-8", "surrogatepass"))
    else:
        path.write_bytes(mutate_bytes(rng, data))
    return str(path)


def _out(rng: random.Random, work: Path, name: str) -> str:
    path = work / name
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    return _pick(rng, str(path), work, 0.1)


def _train(rng, seeds, work) -> list[str]:
    solver = _pick(rng, str(seeds.digits / "tiny_solver.prototxt"), work, 0.1)
    iterations = _number(rng, rng.choice(["0", "1", "2"]), pool=COUNTS)
    argv = ["train", "--solver", solver, "--iterations", iterations, "--progress", "log",
            "--log", str(work / "train.log"), "--force"]  # fmt: skip
    choice = rng.randrange(4)
    if choice == 0:
        argv += ["--snapshot", _mutated(rng, work, "s.solverstate", seeds.digits_state, False)]
    elif choice == 1:
        argv += ["--weights", _mutated(rng, work, "w.caffemodel", seeds.digits_weights, False)]
    elif choice == 2:
        argv += ["--snapshot", str(seeds.edge_states[rng.randrange(len(seeds.edge_states))])]
    return argv


def _test(rng, seeds, work) -> list[str]:
    return ["test", "--model", _pick(rng, str(seeds.digits / "lenet_train_test.prototxt"), work),
            "--weights", _mutated(rng, work, "w.caffemodel", seeds.digits_weights, False),
            "--iterations", _number(rng, "1", pool=COUNTS)]  # fmt: skip


def _net_file(rng, seeds, work) -> str:
    return _mutated(rng, work, "net.prototxt", rng.choice(seeds.nets).encode(), True)


def _time(rng, seeds, work) -> list[str]:
    argv = ["time", "--model", _net_file(rng, seeds, work),
            "--iterations", _number(rng, "1", pool=COUNTS)]  # fmt: skip
    if rng.random() < 0.85:
        argv.append("--no-per-layer")
    if rng.random() < 0.3:
        argv += [
            "--input-shape",
            rng.choice(
                [
                    "data=1,1,8,8",
                    "data=-1",
                    "data=" + "9" * 30,
                    "data=" + "1," * 60,
                    "x=1",
                    "data=1e9,1e9",
                ]
            ),
        ]
    return argv + ["--phase", rng.choice(["TRAIN", "TEST"])]


def _summary(rng, seeds, work) -> list[str]:
    argv = ["summary", _net_file(rng, seeds, work)]
    if rng.random() < 0.3:
        argv += ["--input-shape", rng.choice(["data=2,3", "data=99999999999,99999999999"])]
    return argv


def _upgrade(rng, seeds, work) -> list[str]:
    solver = rng.random() < 0.3
    text = seeds.solvers[0][0] if solver else rng.choice(seeds.nets)
    argv = ["upgrade", _mutated(rng, work, "in.prototxt", text.encode(), True),
            _out(rng, work, "up.prototxt")]  # fmt: skip
    return argv + (["--solver"] if solver else []) + (["--force"] if rng.random() < 0.5 else [])


def _convert_imageset(rng, seeds, work) -> list[str]:
    images = work / "img"
    shutil.rmtree(images, ignore_errors=True)
    images.mkdir()
    lines = []
    for i in range(rng.choice([1, 2, 3])):
        (images / f"{i}.png").write_bytes(hostile_image(rng) if rng.random() < 0.5 else valid(rng))
        lines.append(f"{i}.png {i}")
    (work / "list.txt").write_text(mutate_text(rng, "\n".join(lines)) if rng.random() < 0.2
                                   else "\n".join(lines))  # fmt: skip
    argv = ["convert_imageset", str(images) + "/", str(work / "list.txt"), _out(rng, work, "db")]
    for flag in ("--resize_height", "--resize_width"):
        if rng.random() < 0.3:
            argv += [flag, rng.choice(["8", "100000", "-1", "2147483647", "0"])]
    return argv + rng.sample(["--encoded", "--gray", "--check_size", "--shuffle"], 2)


def _compute_image_mean(rng, seeds, work) -> list[str]:
    db = _pick(rng, str(seeds.digits / "digits_test_lmdb"), work)
    return ["compute_image_mean", db, _out(rng, work, "mean.binaryproto"), "--force"]


def _convert_weights(rng, seeds, work) -> list[str]:
    source = rng.choice(
        [("w.caffemodel", seeds.caffemodel), ("w.caffemodel.h5", seeds.caffemodel_h5)]
    )
    out = rng.choice(["o.caffemodel", "o.caffemodel.h5", "o.txt"])
    return ["convert-weights", _mutated(rng, work, *source, False), _out(rng, work, out), "--force"]


def _export(rng, seeds, work) -> list[str]:
    return ["export", "--model", _pick(rng, str(seeds.format_net), work),
            "--weights", _mutated(rng, work, "w.caffemodel", seeds.caffemodel, False),
            "--out", _out(rng, work, "f.mlir"), "--force"]  # fmt: skip


def _plot(rng, seeds, work) -> list[str]:
    log = (
        "I0101 loop.py:1] Iteration 0 (1 iter/s, 1s/1 iters), loss = 2.3\n"
        "I0101 loop.py:1]     Test net output #0: accuracy = 0.5\n"
    ) * rng.choice([1, 50])
    return ["plot", _mutated(rng, work, "run.log", log.encode(), True),
            _out(rng, work, "p.png"), "--force"]  # fmt: skip


def _draw(rng, seeds, work) -> list[str]:
    return ["draw", _net_file(rng, seeds, work), _out(rng, work, "d.png"), "--force"]


def _rl(rng, seeds, work) -> list[str]:
    solver = bad_path(rng, work) if rng.random() < 0.7 else _net_file(rng, seeds, work)
    return ["rl", "--solver", solver, "--episodes", _number(rng, "1", 0.5)]


VERBS = {
    "train": _train, "test": _test, "time": _time, "summary": _summary, "upgrade": _upgrade,
    "convert_imageset": _convert_imageset, "compute_image_mean": _compute_image_mean,
    "convert-weights": _convert_weights, "export": _export, "plot": _plot, "draw": _draw,
    "device_query": lambda rng, seeds, work: ["device_query"], "rl": _rl,
}  # fmt: skip


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``caffe2jax ARGV`` in this process: (exit status, stderr)."""
    from caffe2jax.cli.main import main

    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 2
    finally:
        for name in ("caffe2jax", "caffe2jax.worker", ""):
            for handler in list(logging.getLogger(name).handlers):
                if isinstance(handler, logging.FileHandler):
                    logging.getLogger(name).removeHandler(handler)
                    handler.close()
    return code, err.getvalue()


def cli_case(seeds, rng: random.Random, work: Path) -> None:
    """One verb, hostile arguments; a clean failure is re-raised as a CaffeError line."""
    verb = rng.choice(sorted(VERBS))
    argv = VERBS[verb](rng, seeds, work)
    code, err = run_cli(argv)
    if code == 0:
        return
    lines = [line for line in err.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if code in (1, 2) and "Traceback" not in err and last.startswith("caffe2jax"):
        if len(last) > MAX_LINE:
            raise AssertionError(f"{verb}: error line of {len(last)} chars: {last[:200]}")
        raise CaffeError(last)
    raise AssertionError(f"{verb} exit {code}: {' | '.join(lines[-3:])[:300]}")
