"""Fuzz cases for the surfaces of hardening round 4 (issue 37): the fork layers' parameters
(Pooling with CEIL and huge strides, darknet2caffe's Pooling, C3D's Pooling3D, SSD's PriorBox,
DetectionEvaluate, MultiBoxLoss with many boxes) compiled and run jitted on small inputs, and
the newer CLI verbs (``detect``, ``convert_annoset``, ``rl`` with hostile rl_param fields).

A fork-layer case passes when the net compiles and its tops are finite, or when a layer
documented to reproduce a non-finite value of its fork says so in a warning naming it, or when
it is refused with a one-line CaffeError; a non-finite top nothing announced is a finding
("silent non-finite"). The CLI cases pass as tests/fuzz/cli_cases.py's do.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import numpy as np

from tests.fuzz.cli_cases import MAX_LINE, NUMBERS, bad_path, run_cli
from tests.fuzz.images import hostile_image, valid

HUGE = [1, 2, 3, 7, 65536, 2**31 - 1]
ODD = ["0", "-1", "nan", "inf", "1e12", "2147483648", "4294967296"]
ROOT = Path(__file__).resolve().parents[2]


def _odd(rng: random.Random, good: str, p: float = 0.25) -> str:
    return rng.choice(ODD) if rng.random() < p else good


def _pooling(rng):
    pool = rng.choice(["MAX", "AVE", "STOCHASTIC"])
    rounding = rng.choice(["", "round_mode: FLOOR", "round_mode: CEIL", "ceil_mode: true"])
    fields = (f"pool: {pool} kernel_size: {rng.choice([1, 2, 3])} stride: {rng.choice(HUGE)} "
              f"pad: {rng.choice([0, 0, 1])} {rounding}")  # fmt: skip
    shape = (1, 2, rng.randint(1, 9), rng.randint(1, 9))
    layer = f'type: "Pooling" bottom: "x" top: "y" pooling_param {{ {fields} }}'
    mish = 'layer { name: "m" type: "Mish" bottom: "y" top: "z" }' if rng.random() < 0.3 else ""
    return layer, {"x": shape}, mish


def _pooling3d(rng):
    fields = (f"pool: {rng.choice(['MAX', 'AVE'])} kernel_size: {rng.choice([1, 2, 3])} "
              f"kernel_depth: {rng.choice([1, 2])} stride: {rng.choice(HUGE)} "
              f"temporal_stride: {rng.choice(HUGE)} pad: {rng.choice([0, 0, 1])}")  # fmt: skip
    shape = (1, 1, rng.randint(1, 5), rng.randint(1, 8), rng.randint(1, 8))
    return f'type: "Pooling3D" bottom: "x" top: "y" pooling3d_param {{ {fields} }}', \
        {"x": shape}, ""  # fmt: skip


def _prior_box(rng):
    fields = [f"min_size: {_odd(rng, str(rng.choice([2, 4, 30])))}"]
    if rng.random() < 0.4:
        fields.append(f"max_size: {_odd(rng, '60')}")
    if rng.random() < 0.4:
        fields.append(f"aspect_ratio: {_odd(rng, '2')} flip: {rng.choice(['true', 'false'])}")
    for name, good in (("variance", "0.1"), ("step", "8"), ("img_h", "32"), ("img_w", "32"),
                       ("img_size", "32"), ("offset", "0.5"), ("step_h", "4")):  # fmt: skip
        if rng.random() < 0.2:
            fields.append(f"{name}: {_odd(rng, good, 0.5)}")
    fields.append(f"clip: {rng.choice(['true', 'false'])}")
    layer = ('type: "PriorBox" bottom: "f" bottom: "x" top: "y" '
             f"prior_box_param {{ {' '.join(fields)} }}")  # fmt: skip
    return layer, {"f": (1, 1, rng.randint(1, 4), rng.randint(1, 4)), "x": (1, 3, 32, 32)}, ""


def _detection_evaluate(rng):
    classes = rng.choice(["3", "21", "2147483647", "429496730", "0", "1"])
    threshold, background = _odd(rng, "0.5", 0.2), rng.choice([0, -1, 5])
    layer = ('type: "DetectionEvaluate" bottom: "d" bottom: "l" top: "y" '
             f"detection_evaluate_param {{ num_classes: {classes} "
             f"background_label_id: {background} overlap_threshold: {threshold} }}")  # fmt: skip
    return layer, {"d": (1, 1, rng.randint(1, 6), 7), "l": (1, 1, rng.randint(1, 6), 8)}, ""


LAYERS = [_pooling, _pooling3d, _prior_box, _detection_evaluate]


def _inputs(rng, shapes: dict) -> dict:
    np_rng = np.random.default_rng(rng.randrange(2**32))
    out = {}
    for name, shape in shapes.items():
        x = np_rng.uniform(0, 1, shape).astype(np.float32)
        if shape[-1] in (7, 8) and name in ("d", "l"):  # detection rows: item 0, labels 1..2
            x[..., 0] = 0
            x[..., 1] = np_rng.integers(1, 3, shape[:-1])
        out[name] = x
    return out


def fork_param_case(seeds, rng: random.Random, work: Path) -> None:
    """One fork layer with fuzzed parameters, compiled and run jitted on small inputs."""
    import jax

    from caffe2jax.lowering.model import compile as compile_net
    from tests.lowering.fork_nets import net

    layer, shapes, after = rng.choice(LAYERS)(rng)
    text = net(f'layer {{ name: "fuzzed" {layer} }}\n{after}', shapes)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model = compile_net(text)
        params, state = model.init(0)
        blobs = jax.jit(model.apply)(params, state, _inputs(rng, shapes), jax.random.key(0))[0]
    said = any("fuzzed" in str(w.message) for w in seen)
    for name, value in blobs.items():
        if name not in shapes and not np.isfinite(np.asarray(value)).all() and not said:
            raise AssertionError(f"silent non-finite top '{name}' of {layer[:160]}")


# -- the newer CLI verbs ------------------------------------------------------------------------

_DETECT: dict[str, Path] = {}


def _detect_weights(work: Path) -> Path:
    """The tiny SSD example's random weights, written once per worker."""
    if "weights" not in _DETECT:
        import caffe2jax
        from caffe2jax.runtime.formats.weights import save_weights

        model = caffe2jax.compile(ROOT / "examples" / "detection" / "tiny_ssd.prototxt")
        folder = work.parent / "detect_seed"
        folder.mkdir(exist_ok=True)
        _DETECT["weights"] = save_weights(folder / "tiny.caffemodel", model, *model.init(0))
    return _DETECT["weights"]


def _huge_png() -> bytes:
    """A PNG whose header claims 60000 × 60000 pixels."""
    import cv2

    png = cv2.imencode(".png", np.zeros((2, 2, 3), np.uint8))[1].tobytes()
    return png[:16] + (60000).to_bytes(4, "big") * 2 + png[24:]


def _image(rng: random.Random, path: Path) -> str:
    choice = rng.random()
    path.write_bytes(_huge_png() if choice < 0.15 else hostile_image(rng) if choice < 0.5
                     else valid(rng))  # fmt: skip
    return str(path)


def _detect(rng, work) -> list[str]:
    labels = work / "labels.txt"
    labels.write_bytes(rng.choice([b"bg\ncat\n", b"bg\ncaf\xe9\n", b"\xff\xfe\x00", b""]))
    argv = ["detect", str(ROOT / "examples" / "detection" / "tiny_ssd.prototxt"),
            str(_detect_weights(work)), _image(rng, work / "a.png")]  # fmt: skip
    if rng.random() < 0.5:
        argv += ["--labels", rng.choice([str(labels), bad_path(rng, work)])]
    if rng.random() < 0.4:
        argv += ["--mean", rng.choice(["0", "1,2", "nan", "1,2,3", "abc", "1e40,0,0"])]
    if rng.random() < 0.3:
        argv += ["--threshold", rng.choice(NUMBERS[:6])]
    return argv


def _convert_annoset(rng, work) -> list[str]:
    images = work / "anno"
    images.mkdir(exist_ok=True)
    lines = []
    for i in range(rng.choice([1, 2])):
        _image(rng, images / f"{i}.png")
        (images / f"{i}.txt").write_text(rng.choice(["1 0 0 4 4", "2147483648 0 0 1 1",
                                                     "1 nan 0 1 1", "x", ""]))  # fmt: skip
        lines.append(f"{i}.png {i}.txt" + ("\x00" if rng.random() < 0.1 else ""))
    (work / "anno.txt").write_text("\n".join(lines))
    out = work / "anno_db"
    if out.exists():
        import shutil

        shutil.rmtree(out)
    argv = ["convert_annoset", str(images) + "/", str(work / "anno.txt"), str(out),
            "--label_type=txt"]  # fmt: skip
    for flag in ("--min_dim", "--max_dim", "--resize_height", "--resize_width"):
        if rng.random() < 0.25:
            argv.append(f"{flag}={rng.choice(['1', '8', '100000', '-1', '2147483647', '0'])}")
    return argv


def _rl(rng, work) -> list[str]:
    folder = ROOT / "examples" / "rl"
    (work / "cartpole_softmax.prototxt").write_text(
        (folder / "cartpole_softmax.prototxt").read_text()
    )
    fields = [f"batch_size: {rng.choice(['1', '2', '2147483647', '0', '-1'])}"]
    for name, good in (("eps_steps", "10"), ("eps_start", "0.5"), ("gamma", "0.99"),
                       ("seed", "3")):  # fmt: skip
        if rng.random() < 0.3:
            fields.append(f"{name}: {rng.choice(['4294967295', '2147483647', 'nan', '-1', good])}")
    solver = (folder / "cartpole_softmax_solver.prototxt").read_text()
    (work / "rl_solver.prototxt").write_text(solver.replace("batch_size: 10", " ".join(fields)))
    argv = ["rl", "--solver", str(work / "rl_solver.prototxt"), "--episodes",
            rng.choice(["1", "2", "-1", "0"])]  # fmt: skip
    if rng.random() < 0.3:
        argv += ["--seed", rng.choice(["0", str(2**64), "-1", str(2**63)])]
    if rng.random() < 0.2:
        argv += ["--plot", rng.choice(["p.xyz", "p.png", "missing/p.png"])]
    if rng.random() < 0.2:
        argv += ["--test", "--weights", "w.caffemodel"]
    return argv


NEW_VERBS = {"detect": _detect, "convert_annoset": _convert_annoset, "rl": _rl}


def new_verb_case(seeds, rng: random.Random, work: Path) -> None:
    """One of the newer verbs with hostile arguments (the pass rule of cli_cases.cli_case)."""
    from caffe2jax.frontend.errors import CaffeError

    verb = rng.choice(sorted(NEW_VERBS))
    code, err = run_cli(NEW_VERBS[verb](rng, work))
    if code == 0:
        return
    lines = [line for line in err.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if code in (1, 2) and "Traceback" not in err and last.startswith("caffe2jax"):
        if len(last) > MAX_LINE:
            raise AssertionError(f"{verb}: error line of {len(last)} chars: {last[:200]}")
        raise CaffeError(last)
    raise AssertionError(f"{verb} exit {code}: {' | '.join(lines[-3:])[:300]}")
