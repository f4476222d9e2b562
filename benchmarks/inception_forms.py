"""Candidate forms for GoogLeNet's forward-only layers, each against the form caffe2jax runs
today, at GoogLeNet's own shapes (issue 39 item 2: GoogLeNet forward ≤ 0.8× ONNX Runtime).

    python benchmarks/inception_forms.py [--batch 1] [--blocks 7] [--calls 10]
        [--only pointwise,siblings,winograd,pool]

One process, the two forms of a row alternating block by block (each block ``--calls``
calls), medians over blocks of both the wall time and the process CPU time per call (on a
shared machine the CPU time is the steadier figure: it counts the work, not the waiting).
Every row checks the candidate's result against today's form first (the largest difference,
relative to the largest value, is printed). The rows:

* ``pointwise``: a 1×1 convolution (+ bias + ReLU) as XLA's matrix product (today: YNNPACK
  under XLA:CPU) vs oneDNN's 1×1 convolution with weights packed once (packing.py).
* ``siblings``: an inception's 1x1, 3x3_reduce and 5x5_reduce (one bottom) as three matrix
  products vs one product with the weights concatenated, the tops sliced.
* ``winograd``: a 3×3, stride-1, pad-1 convolution by oneDNN with packed weights vs
  Winograd's F(2×2, 3×3) in XLA (weights transformed once; 16 batched products).
* ``pool``: MAX pooling 3×3 as today's elementwise max of 9 strided views vs a separable max
  (3 column views, then 3 row views), behind the producer GoogLeNet has there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from caffe2jax.lowering.engines import onednn, packing, windows  # noqa: E402

# GoogLeNet's (bvlc_googlenet deploy) shapes: (H = W, channels in, [outputs])
POINTWISE = [(28, 192, 64), (28, 256, 64), (28, 256, 128), (28, 192, 16), (14, 480, 192),
             (14, 512, 128), (14, 528, 256), (7, 832, 384), (7, 832, 128)]  # fmt: skip
SIBLINGS = {"3a": (28, 192, [64, 96, 16]), "3b": (28, 256, [128, 128, 32]),
            "4a": (14, 480, [192, 96, 16]), "4c": (14, 512, [128, 128, 24]),
            "4e": (14, 528, [256, 160, 32]), "5b": (7, 832, [384, 192, 48])}  # fmt: skip
WINOGRAD = [(56, 64, 192), (28, 96, 128), (28, 128, 192), (14, 96, 208), (14, 112, 224),
            (14, 128, 256), (14, 144, 288), (14, 160, 320), (7, 160, 320),
            (7, 192, 384)]  # fmt: skip
POOLS = [("pool1", 112, 64, 2, 0, "relu"), ("pool2", 56, 192, 2, 0, "lrn"),
         ("inception_3b/pool", 28, 256, 1, 1, "relu"), ("pool3", 28, 480, 2, 0, "copy"),
         ("inception_4e/pool", 14, 528, 1, 1, "relu"),
         ("inception_5b/pool", 7, 832, 1, 1, "relu")]  # fmt: skip

# Winograd F(2×2, 3×3) (Lavin & Gray 2015): Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float32)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float32)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float32)


def timed(forms: dict, blocks: int, calls: int) -> dict[str, tuple[float, float]]:
    """form → (median wall ms, median CPU ms) per call, the forms alternating block by block."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in forms}
    for _ in range(blocks):
        for name, run in forms.items():
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(calls):
                jax.block_until_ready(run())
            times[name].append(((time.perf_counter() - wall) / calls * 1e3,
                                (time.process_time() - cpu) / calls * 1e3))  # fmt: skip
    return {n: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
            for n, t in times.items()}  # fmt: skip


def pair(names, fa, a, fb, b) -> tuple[dict, float]:
    """Two jitted forms with their arguments as zero-argument runners, and their gap."""
    forms = {names[0]: lambda: fa(*a), names[1]: lambda: fb(*b)}
    return forms, gap_of(fa(*a), fb(*b))


def row(what: str, forms: dict, args, gap: float) -> tuple[float, float, float, float]:
    (today, cand), got = list(forms), timed(forms, args.blocks, args.calls)
    (wa, ca), (wb, cb) = got[today], got[cand]
    print(f"| {what} | {wa:.3f} / {ca:.3f} | {wb:.3f} / {cb:.3f} | {wb / wa:.2f} | "
          f"{cb / ca:.2f} | {gap:.1e} |", flush=True)  # fmt: skip
    return wa, ca, wb, cb


def gap_of(a, b) -> float:
    a, b = jax.tree.leaves(a), jax.tree.leaves(b)
    return max(float(np.abs(np.asarray(x) - np.asarray(y)).max() / np.abs(np.asarray(x)).max())
               for x, y in zip(a, b))  # fmt: skip


def dot(x, w2):
    return lax.dot_general(x, w2, (((3,), (1,)), ((), ())))


def packed_conv(x, w: np.ndarray, pad: int):
    """(the oneDNN geometry, its packed weights) for ``x`` NHWC ⊛ Caffe weights ``w``."""
    g = onednn.geometry(x, w, (1, 1), (pad, pad), (1, 1), 1, True)
    data = jnp.asarray(onednn.primitives(g.key()).pack(w))
    return g, packing.PackedWeights(data, ("bench", 0), w.shape, g.key())


def pointwise_rows(args, rng):
    for hw, c, o in POINTWISE:
        x = jnp.asarray(rng.standard_normal((args.batch, hw, hw, c), np.float32))
        w = rng.standard_normal((o, c, 1, 1), np.float32)
        b = jnp.asarray(rng.standard_normal((o,), np.float32))
        g, pw = packed_conv(x, w, 0)
        w2 = jnp.asarray(w.reshape(o, c))
        xla = jax.jit(lambda x, w, b: jnp.maximum(dot(x, w) + b, 0))
        dnn = jax.jit(lambda x, w, b, g=g: jnp.maximum(packing.convolve(g, x, w) + b, 0))
        forms, gap = pair(("xla", "onednn"), xla, (x, w2, b), dnn, (x, pw, b))
        yield row(f"1×1 {hw}² {c}→{o}", forms, args, gap)


def sibling_rows(args, rng):
    for name, (hw, c, outs) in SIBLINGS.items():
        x = jnp.asarray(rng.standard_normal((args.batch, hw, hw, c), np.float32))
        ws = [jnp.asarray(rng.standard_normal((o, c), np.float32)) for o in outs]
        bs = [jnp.asarray(rng.standard_normal((o,), np.float32)) for o in outs]
        wm, bm, ends = jnp.concatenate(ws), jnp.concatenate(bs), np.cumsum([0, *outs])

        def merged(x, wm, bm, ends=ends):
            y = jnp.maximum(dot(x, wm) + bm, 0)
            return [y[..., a:z] for a, z in zip(ends[:-1], ends[1:])]

        three = jax.jit(lambda x, ws, bs: [jnp.maximum(dot(x, w) + b, 0) for w, b in zip(ws, bs)])
        forms, gap = pair(("three", "merged"), three, (x, ws, bs), jax.jit(merged), (x, wm, bm))
        yield row(f"inception_{name} {hw}² {c}→{'+'.join(map(str, outs))}", forms, args, gap)


def _combo(parts, coeffs):
    """Σ coeffs[k]·parts[k], skipping zeros (the transforms' entries are 0, ±1, ±½)."""
    out = None
    for k, p in zip(coeffs, parts):
        if k:
            term = p if k == 1 else -p if k == -1 else p * k
            out = term if out is None else out + term
    return out


def winograd_weights(w):
    """Caffe's (O, C, 3, 3) → the 16 transformed (C, O) matrices G g Gᵀ (done once)."""
    u = jnp.einsum("ak,ockl,bl->aboc", G, w, G)
    return u.reshape(16, *u.shape[2:]).transpose(0, 2, 1)


def winograd(x, u):
    """NHWC ``x`` ⊛ 3×3 (stride 1, pad 1) by F(2×2, 3×3): 4×4 input tiles every 2 pixels."""
    n, h, w, c = x.shape
    th, tw = -(-h // 2), -(-w // 2)
    xp = jnp.pad(x, [(0, 0), (1, 2 * th + 1 - h), (1, 2 * tw + 1 - w), (0, 0)])
    d = [[xp[:, i : i + 2 * th : 2, j : j + 2 * tw : 2] for j in range(4)] for i in range(4)]
    t = [[_combo([d[k][j] for k in range(4)], BT[a]) for j in range(4)] for a in range(4)]
    v = jnp.stack([_combo(t[a], BT[b]) for a in range(4) for b in range(4)])
    m = lax.dot_general(v.reshape(16, n * th * tw, c), u, (((2,), (1,)), ((0,), (0,))))
    m = m.reshape(4, 4, n, th, tw, -1)
    s = [[_combo([m[a, b] for b in range(4)], AT[q]) for q in range(2)] for a in range(4)]
    y = jnp.stack([jnp.stack([_combo([s[a][q] for a in range(4)], AT[p]) for q in range(2)], 3)
                   for p in range(2)], 2)  # fmt: skip
    return y.reshape(n, 2 * th, 2 * tw, -1)[:, :h, :w]


def winograd_rows(args, rng):
    for hw, c, o in WINOGRAD:
        x = jnp.asarray(rng.standard_normal((args.batch, hw, hw, c), np.float32))
        w = rng.standard_normal((o, c, 3, 3), np.float32) * 0.05
        b = jnp.asarray(rng.standard_normal((o,), np.float32))
        g, pw = packed_conv(x, w, 1)
        u = jax.jit(winograd_weights)(jnp.asarray(w))
        dnn = jax.jit(lambda x, w, b, g=g: jnp.maximum(packing.convolve(g, x, w) + b, 0))
        wino = jax.jit(lambda x, u, b: jnp.maximum(winograd(x, u) + b, 0))
        forms, gap = pair(("onednn", "winograd"), dnn, (x, pw, b), wino, (x, u, b))
        yield row(f"3×3 {hw}² {c}→{o}", forms, args, gap)


def separable_max(x, spec):
    """The max of every window as a max over 3 column views, then over 3 row views (max is
    exact: the same values as the 9-view max)."""
    padded = jnp.pad(x, windows.padding(spec, x.shape[1:3], True), constant_values=-jnp.inf)
    (sh, sw), (oh, ow), (kh, kw) = spec.stride, spec.out, spec.kernel
    cols = _max([padded[:, :, j : j + (ow - 1) * sw + 1 : sw] for j in range(kw)])
    return _max([cols[:, i : i + (oh - 1) * sh + 1 : sh] for i in range(kh)])


def _max(views):
    out = views[0]
    for v in views[1:]:
        out = jnp.maximum(out, v)
    return out


PRODUCERS = {
    "relu": lambda x, b: jnp.maximum(x + b, 0),
    "lrn": lambda x, b: x * jnp.power(1 + 1e-4 * x * x, -0.75),  # LRN's power, roughly
    "copy": lambda x, b: x,
}


def pool_rows(args, rng):
    for name, hw, c, s, p, producer in POOLS:
        x = jnp.asarray(rng.standard_normal((args.batch, hw, hw, c), np.float32))
        b = jnp.asarray(rng.standard_normal((c,), np.float32))
        out = -(-(hw + 2 * p - 3) // s) + 1  # Caffe's ceil
        spec = SimpleNamespace(kernel=(3, 3), stride=(s, s), pad=(p, p), out=(out, out))
        f, views = PRODUCERS[producer], producer != "lrn"  # reduce_window behind LRN today
        today = jax.jit(lambda x, b, f=f, s=spec, v=views: windows.window_max(f(x, b), s, True, v))
        cand = jax.jit(lambda x, b, f=f, spec=spec: separable_max(f(x, b), spec))
        forms, gap = pair(("today", "separable"), today, (x, b), cand, (x, b))
        yield row(f"{name} {hw}² ×{c} ({producer})", forms, args, gap)


SECTIONS = {"pointwise": ("1×1: XLA's product vs oneDNN packed", pointwise_rows),
            "siblings": ("sibling 1×1s: three products vs one merged", sibling_rows),
            "winograd": ("3×3: oneDNN packed vs Winograd F(2×2,3×3) in XLA", winograd_rows),
            "pool": ("MAX 3×3: today's form vs separable", pool_rows)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--only", default=",".join(SECTIONS))
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"batch {args.batch}, load {os.getloadavg()[0]:.1f} at the start")
    for key in args.only.split(","):
        title, rows = SECTIONS[key]
        print(f"\n{title} (ms per call, wall / CPU; ratios candidate ÷ today)\n")
        print("| case | today | candidate | wall ratio | CPU ratio | max gap |")
        print("|---|---|---|---|---|---|")
        got = list(rows(args, rng))
        wa, ca, wb, cb = (sum(col) for col in zip(*got))
        print(f"| **sum** | {wa:.2f} / {ca:.2f} | {wb:.2f} / {cb:.2f} | {wb / wa:.2f} | "
              f"{cb / ca:.2f} | |")  # fmt: skip
    print(f"\nload {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
