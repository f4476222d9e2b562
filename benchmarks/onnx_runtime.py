"""onnxruntime on caffe2jax's ONNX exports against caffe2jax's jitted forward (issue 34).

    python benchmarks/onnx_runtime.py [--batch 1] [--blocks 5] [--calls 5]
        [--nets googlenet,resnet50] [--peer onnxruntime|unpacked|unfolded|direct] [--winograd]

GoogLeNet (BVLC's deploy prototxt from ../shared/caffe/models), ResNet-50 (He et al. 2016,
the published deploy net's layers, built here with NetSpec) and YOLOv3 (``--nets yolov3``:
eric612's Darknet-53 port from ../shared/forks/models, 416×416, its Yolov3DetectionOutput
timed, its three heads compared), random weights (their fillers; BatchNorm statistics mean 0,
variance 1). Each net is exported with ``caffe2jax.export_onnx``
and run by an onnxruntime CPU session at its default options (all graph optimizations, its
own thread pool); caffe2jax's forward is ``jax.jit(model.apply)`` with the CLI's JAX setup, on
``model.packed(params, state)`` (oneDNN's weights packed once, each in-place Convolution →
BatchNorm → Scale folded into the convolution and a convolution's bias and ReLU run inside its
oneDNN primitive, as pycaffe's whole-net ``Net.forward`` runs it; ``--peer unpacked`` times
that against the same forward on Caffe-layout weights, ``--peer unfolded`` against the packed
forward without folding or fusing, ``--peer direct`` the forward with policy ``winograd`` (3×3s
as Winograd's F(2×2, 3×3)) against the same packed forward without it). Both are timed in one
run, in alternating blocks (benchmarks/harness.py: median block, compile and session creation
apart); the logits (a detector's heads: the bottoms of its last layer) are checked to agree
first, within 1e-4 of their largest magnitude, and the folded forward with the plain one within
1e-5. Prints the markdown table and writes
``benchmarks/results/onnx-runtime-<time>.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Row, machine, measure, write  # noqa: E402

from caffe2jax.cli.main import configure_jax  # noqa: E402

MODELS = Path(__file__).resolve().parents[2] / "shared/caffe/models"
GOOGLENET = MODELS / "models/bvlc_googlenet/deploy.prototxt"
YOLOV3 = MODELS.parent.parent / "forks/models/yolov3_darknet53_eric612.prototxt"


def resnet50(path: Path, batch: int) -> Path:
    """ResNet-50's deploy net as a prototxt (conv → BatchNorm → Scale → ReLU blocks)."""
    import caffe2jax as caffe
    from caffe2jax import layers as L
    from caffe2jax import params as P

    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[batch, 3, 224, 224]))

    def conv_bn(bottom, name, out, k, stride=1, pad=0, relu=True):
        c = L.Convolution(bottom, num_output=out, kernel_size=k, stride=stride, pad=pad,
                          bias_term=False, weight_filler=dict(type="msra"))  # fmt: skip
        setattr(n, name, c)
        setattr(n, "bn_" + name, L.BatchNorm(c, in_place=True))
        setattr(n, "scale_" + name, L.Scale(c, bias_term=True, in_place=True))
        if relu:
            setattr(n, name + "_relu", L.ReLU(c, in_place=True))
        return c

    top = conv_bn(n.data, "conv1", 64, 7, 2, 3)
    n.pool1 = top = L.Pooling(top, pool=P.Pooling.MAX, kernel_size=3, stride=2)
    for stage, (blocks, width) in enumerate([(3, 64), (4, 128), (6, 256), (3, 512)], start=2):
        for b in range(blocks):
            name = f"res{stage}{chr(97 + b)}"
            stride = 2 if b == 0 and stage > 2 else 1
            short = conv_bn(top, name + "_branch1", 4 * width, 1, stride, relu=False) if b == 0 \
                else top  # fmt: skip
            x = conv_bn(top, name + "_branch2a", width, 1, stride)
            x = conv_bn(x, name + "_branch2b", width, 3, 1, 1)
            x = conv_bn(x, name + "_branch2c", 4 * width, 1, relu=False)
            setattr(n, name, L.Eltwise(short, x))
            top = getattr(n, name)
            setattr(n, name + "_relu", L.ReLU(top, in_place=True))
    n.pool5 = L.Pooling(top, pool=P.Pooling.AVE, kernel_size=7, stride=1)
    n.fc1000 = L.InnerProduct(n.pool5, num_output=1000, weight_filler=dict(type="xavier"))
    n.prob = L.Softmax(n.fc1000)
    path.write_text('name: "ResNet-50"\n' + str(n.to_proto()))
    return path


def weights(model):
    """The nets' fillers; BatchNorm statistics of a trained net (mean 0, variance 1)."""
    params, state = model.init(0)
    for name, blobs in state.items():
        if len(blobs) == 3:
            c = blobs[0].shape
            state[name] = [np.zeros(c, np.float32), np.ones(c, np.float32), np.ones(1, np.float32)]
    return params, state


def _compare(blobs, mine: dict, session, x, name: str) -> float:
    """The largest gap between caffe2jax's and onnxruntime's ``blobs``, each relative to its
    largest magnitude (checked below 1e-4)."""
    theirs = session.run(blobs, {"data": x})
    gap = max(float(np.abs(mine[b] - t).max() / np.abs(mine[b]).max())
              for b, t in zip(blobs, theirs))  # fmt: skip
    assert gap < 1e-4, f"{name}: {blobs} differ by {gap:.2e}"
    return gap


def case(
    name: str,
    prototxt: Path,
    batch: int,
    folder: Path,
    calls: int,
    blocks: int,
    peer: str = "onnxruntime",
    side: int = 224,
    out: str = "prob",
    winograd: bool = False,
) -> Row:
    import jax
    import onnxruntime as ort

    import caffe2jax

    policy = caffe2jax.EnginePolicy.from_env(winograd=winograd or peer == "direct")
    model = caffe2jax.compile(prototxt, input_shapes={"data": (batch, 3, side, side)},
                              policy=policy)  # fmt: skip
    params, state = weights(model)
    last = model.net.layer(model.net.layers[-1].name)
    checks = list(dict.fromkeys(last.bottom_names))  # the logits, or a detector's heads
    start = time.perf_counter()
    onnx_file = caffe2jax.export_onnx(model, params, state, folder / f"{name}.onnx",
                                      outputs=[out, *checks])  # fmt: skip
    export_s = time.perf_counter() - start
    x = np.random.default_rng(0).uniform(0, 1, (batch, 3, side, side)).astype(np.float32)
    forward = jax.jit(lambda p, s, v: model.apply(p, s, {"data": v})[0][out])
    check = jax.jit(lambda p, s, v: {b: model.apply(p, s, {"data": v})[0][b] for b in checks})
    params, state, xj = jax.device_put((params, state, x))
    packed = model.packed(params, state)  # packed once, BatchNorm folded, as Net.forward
    ours = lambda: forward(packed, state, xj)  # noqa: E731
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    theirs = lambda: session.run([out], {"data": x})[0]  # noqa: E731
    mine = {b: np.asarray(v) for b, v in check(packed, state, xj).items()}
    for b, plain in check(params, state, xj).items():
        gap = np.abs(mine[b] - plain).max() / np.abs(plain).max()
        assert gap <= 1e-5, f"{name}: folding changed {b} by {gap:.2e}"
    note = f"export {export_s:.1f} s, {'/'.join(checks)} within " \
        f"{_compare(checks, mine, session, x, name):.1e}"  # fmt: skip
    row = Row(f"{name} b{batch} forward", "onnxruntime", note=note)
    if peer == "unpacked":  # packing's own effect: the same forward on Caffe-layout weights
        row.peer = "caffe2jax unpacked"
        return measure(row, ours, lambda: lambda: forward(params, state, xj), calls, blocks)
    if peer == "unfolded":  # folding's own effect: packed weights, BatchNorm and Scale run
        row.peer, unfolded = "caffe2jax unfolded", model.packed(params)
        return measure(row, ours, lambda: lambda: forward(unfolded, state, xj), calls, blocks)
    if peer == "direct":  # Winograd's own effect: the same packed forward, 3×3s on oneDNN
        from caffe2jax.lowering.engines import packing
        from caffe2jax.lowering.layers import vision

        row.peer = "caffe2jax direct 3×3s"
        direct = packing.Packer(vision.onednn_keys(model.graph))(params)
        return measure(row, ours, lambda: lambda: forward(direct, state, xj), calls, blocks)
    return measure(row, ours, lambda: theirs, calls, blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--nets", default="googlenet,resnet50", help="comma-separated")
    parser.add_argument(
        "--peer",
        choices=("onnxruntime", "unpacked", "unfolded", "direct"),
        default="onnxruntime",
        help="unpacked: caffe2jax's forward without packed oneDNN weights or folding; "
        "unfolded: packed, BatchNorm and Scale not folded into the convolutions; "
        "direct: caffe2jax with Winograd's 3×3s (policy winograd) vs without",
    )
    parser.add_argument(
        "--winograd",
        action="store_true",
        help="caffe2jax's 3×3s as Winograd's F(2×2, 3×3) (policy winograd)",
    )
    args = parser.parse_args()
    configure_jax(compile_cache=False)
    folder = Path(tempfile.mkdtemp(prefix="caffe2jax-onnx-bench-"))
    wanted = args.nets.split(",")
    nets = [
        ("GoogLeNet", lambda: GOOGLENET, {}),
        ("ResNet-50", lambda: resnet50(folder / "resnet50.prototxt", args.batch), {}),
        ("YOLOv3", lambda: YOLOV3, {"side": 416, "out": "detection_out"}),
    ]
    kw0 = {"winograd": args.winograd}
    rows = [case(n, p(), args.batch, folder, args.calls, args.blocks, args.peer, **kw0, **kw)
            for n, p, kw in nets if n.lower().replace("-", "") in wanted]  # fmt: skip
    info = machine()
    import onnxruntime

    info["onnxruntime"] = onnxruntime.__version__
    title = f"onnxruntime {onnxruntime.__version__} on caffe2jax's ONNX export vs caffe2jax"
    if args.peer == "unpacked":
        title = "caffe2jax with oneDNN weights packed once vs unpacked (Caffe layout)"
    if args.peer == "unfolded":
        title = "caffe2jax with BatchNorm and Scale folded into the convolutions vs not"
    if args.peer == "direct":
        title = "caffe2jax with Winograd F(2×2,3×3) 3×3s vs oneDNN's direct ones"
    write("onnx-runtime", title, rows, info, "python benchmarks/onnx_runtime.py " +
          " ".join(sys.argv[1:]))  # fmt: skip


if __name__ == "__main__":
    main()
