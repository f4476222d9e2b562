"""`caffe2jax time --model M [--iterations N]`: forward and backward timings, like `caffe time`.

Per-layer lines, then Caffe's averages: from one profile of the fused forward-backward program
(``--profile DIR`` keeps it), or with ``--per-layer-programs`` from compiled per-layer programs
(each line printed as soon as its layer is timed); then the times of the one fused XLA program
the net runs as, compile times and peak memory (see :mod:`caffe2jax.runtime.tools.timing`).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import jax

from caffe2jax import logs
from caffe2jax.cli.args import Subparsers, add_dialect, int32
from caffe2jax.frontend.errors import CaffeError


def add(sub: Subparsers) -> None:
    p = sub.add_parser("time", help="time a net's forward and backward passes")
    p.add_argument("--model", required=True, help="net prototxt")
    p.add_argument("--iterations", type=int32, default=50)
    add_dialect(p, "how the net's fork layers are read (default: from the prototxt)")
    p.add_argument("--phase", default="TRAIN", choices=["TRAIN", "TEST"])
    p.add_argument(
        "--precision",
        default="fp32",
        choices=["fp32", "tf32", "bf16"],
        help="how layers compute (params stay fp32)",
    )
    p.add_argument("--gpu", help="time on a GPU (an id, e.g. 0); default: the CPU")
    p.add_argument(
        "--profile", metavar="DIR",
        help="write the profile of the fused forward-backward program to DIR (TensorBoard's "
             "profile plugin, or the .trace.json.gz in ui.perfetto.dev); the per-layer lines "
             "come from it (without this flag, from a profile in a temporary folder)",
    )  # fmt: skip
    lines = p.add_mutually_exclusive_group()
    lines.add_argument(
        "--per-layer-programs", dest="per_layer", action="store_const", const="programs",
        default="profile",
        help="per-layer lines from each layer compiled and timed alone (Caffe's own per-layer "
             "figures; one compile per kind of layer: minutes on a deep net)",
    )  # fmt: skip
    lines.add_argument(
        "--no-per-layer", dest="per_layer", action="store_const", const="none",
        help="time only the fused whole-net programs",
    )  # fmt: skip
    p.add_argument(
        "--input-shape", action="append", default=[], metavar="BLOB=D0,D1,...",
        help="shape of an input blob whose data source is not at hand (repeatable)",
    )  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from caffe2jax.cli.args import parse_shapes
    from caffe2jax.frontend.pipeline import load_net
    from caffe2jax.lowering.model import Model
    from caffe2jax.lowering.registry import type_problem
    from caffe2jax.runtime.data.feeding import source_shapes
    from caffe2jax.runtime.host.memory import check_net_fits
    from caffe2jax.runtime.tools.profiling import writable_folder
    from caffe2jax.runtime.tools.timing import LayerTime, random_inputs, time_net

    if args.iterations <= 0:
        raise CaffeError(f"--iterations must be > 0, got {args.iterations}")
    if args.profile is not None:  # before minutes of compiles, not after them
        writable_folder(args.profile)
    log = logs.setup(None)
    net = load_net(args.model, args.phase, layer_types=type_problem)
    shapes, _ = source_shapes(net, Path(args.model).parent)
    shapes.update(parse_shapes(args.input_shape))
    model = Model(net, shapes, precision=args.precision)
    # forward activations, their gradients and the params' values and gradients
    check_net_fits(model.net, itemsize=8, params=model.graph.decls)
    device = _device(args.gpu) or jax.devices()[0]
    with jax.default_device(device), _profile_folder(args) as folder:
        inputs = random_inputs(model)
        log.info(f"Benchmark on {device}, precision {args.precision}: testing for "
                 f"{args.iterations} iterations.")  # fmt: skip
        if args.per_layer != "none":
            log.info("Average time per layer: ")

        def layer_lines(layer: LayerTime) -> None:  # printed as soon as each is timed
            log.info(f"{layer.name:>10}\tforward: {layer.forward_ms:.5g} ms.")
            log.info(f"{layer.name:>10}\tbackward: {layer.backward_ms:.5g} ms.")

        t = time_net(model, inputs, args.iterations, per_layer=args.per_layer == "programs",
                     on_layer=layer_lines, profile=folder,
                     perfetto=args.profile is not None)  # fmt: skip
    _report(log, t, args.iterations, keep=args.profile is not None)
    return 0


@contextlib.contextmanager
def _profile_folder(args: argparse.Namespace) -> Iterator[Path | None]:
    """Where the profile goes: ``--profile DIR``; a temporary folder (removed after) when only
    the per-layer lines need it; None when nothing is profiled."""
    if args.profile is not None:
        yield Path(args.profile)
    elif args.per_layer == "profile":
        with tempfile.TemporaryDirectory(prefix="caffe2jax-profile-") as folder:
            yield Path(folder)
    else:
        yield None


def _device(gpu: str | None):
    """The device ``--gpu`` names (None: JAX's default); a clear error when there is none."""
    if gpu is None:
        return None
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        raise CaffeError(f"--gpu {gpu}: no GPU visible to JAX (install jax[cuda12])")
    if not gpu.isdigit() or int(gpu) >= len(gpus):
        raise CaffeError(f"--gpu {gpu}: GPUs available: {', '.join(map(str, range(len(gpus))))}")
    return gpus[int(gpu)]


def _report(log, t, iterations: int, keep: bool) -> None:
    """Caffe's lines (time.cpp's shapes), then the fused program's figures."""
    if t.layers:  # the per-layer lines came as each layer was timed
        log.info(f"Average Forward pass: {t.forward_ms:.5g} ms.")
        log.info(f"Average Backward pass: {t.backward_ms:.5g} ms.")
        log.info(f"Average Forward-Backward: {t.forward_ms + t.backward_ms:.5g} ms.")
        log.info(f"Total Time: {(t.forward_ms + t.backward_ms) * iterations:.5g} ms.")
    if t.layers and t.profile is None:
        log.info(f"(per-layer figures: compiled per-layer programs, {t.layer_programs} for "
                 f"{len(t.layers)} layers as layers alike share theirs; compiling them took "
                 f"{t.compile_layers_s:.3g} s)")  # fmt: skip
    if t.profile is not None:
        _profile_lines(log, t.profile, keep)
    seed = "the loss" if t.seeded == "loss" else "top diffs of ones at the outputs"
    log.info(f"Fused forward (one XLA program, returning the net's outputs): "
             f"{t.fused_forward_ms:.5g} ms.")  # fmt: skip
    log.info(f"Fused forward-backward (one XLA program, from {seed}): "
             f"{t.fused_forward_backward_ms:.5g} ms.")  # fmt: skip
    log.info(f"Compile time (XLA, or the compilation cache): forward {t.compile_forward_s:.3g} "
             f"s, forward-backward {t.compile_forward_backward_s:.3g} s; tracing to StableHLO "
             f"{t.trace_forward_s:.3g} s and {t.trace_forward_backward_s:.3g} s.")  # fmt: skip
    log.info(f"Peak memory: {t.peak_bytes / 2**20:.1f} MiB ({t.peak_source}).")


def _profile_lines(log, profile, keep: bool) -> None:
    """Where the per-layer figures came from, what the profile left outside the layers, and
    where the trace is."""
    log.info(f"(per-layer figures: one profile of the fused forward-backward program: "
             f"{profile.ops} ops, {profile.ops_ms:.5g} ms of op time per iteration on "
             f"{profile.threads} thread(s), {profile.outside_ms:.5g} ms of it under no layer; "
             f"the program took {profile.wall_ms:.5g} ms per iteration while profiled; "
             f"--per-layer-programs times each layer alone as Caffe does)")  # fmt: skip
    if keep and profile.trace is not None:
        log.info(f"Profile written to {profile.trace.parent} (TensorBoard: tensorboard "
                 f"--logdir {profile.trace.parents[3]}; Perfetto: perfetto_trace.json.gz there, at "
                 f"ui.perfetto.dev)")  # fmt: skip
