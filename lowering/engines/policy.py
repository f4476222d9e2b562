"""The engine policy: one frozen record saying which form each convolution and pooling takes.

Every form computes the layer Caffe defines, to float rounding; they differ in speed only
(docs/performance.md measures each on vs off). A net's policy is fixed when it is compiled:
``Graph(..., policy=)`` / ``compile(..., policy=)``, by default :meth:`EnginePolicy.from_env`
(the user's switches, read once per compiled net and checked). When the graph is planned, each
Convolution and Pooling asks the policy for its form (:meth:`EnginePolicy.conv_form`,
:meth:`EnginePolicy.pool_form`) from static facts only (shapes, dtype, layout, the type of the
layer that produced its bottom); the lowering receives that choice as ``ctx.engine``. Nothing
here is read while a program is traced, so a net behaves the same however often it is traced.

The switches (read through lowering/engines/environment.py; docs/environment.md lists every
variable, docs/performance.md "Engine switches" what each setting does):

* ``$CAFFE2JAX_CPU_CONV`` → :attr:`EnginePolicy.conv`: ``auto`` (unset), ``onednn``,
  ``onednn-all`` or ``xla`` (lowering/engines/onednn.py).
* ``$CAFFE2JAX_POOL`` → :attr:`EnginePolicy.pool`: ``auto`` (unset), ``phases`` or ``xla``
  (lowering/engines/windows.py).
* ``$CAFFE2JAX_CHANNELS_LAST`` → :attr:`EnginePolicy.channels_last`: ``1`` (unset) or ``0``
  (lowering/layout.py).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from caffe2jax.frontend import environment
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.engines import onednn

CONV_ENV = "CAFFE2JAX_CPU_CONV"
POOL_ENV = "CAFFE2JAX_POOL"
CHANNELS_LAST_ENV = "CAFFE2JAX_CHANNELS_LAST"
CONV_SETTINGS = ("auto", "onednn", "onednn-all", "xla")
POOL_SETTINGS = ("auto", "phases", "xla")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")

# The forms a Convolution's ctx.engine names (lowering/engines/conv_forms.py), and a MAX/AVE
# Pooling's: "phases" (windows as strided views; backward as phase sums), "phases-rw" (the
# same backward, the forward XLA's reduce_window, which reads its input once), "xla"
# (reduce_window and its autodiff).
CONV_FORMS = (
    "xla",
    "onednn",
    "onednn-blocked",
    "onednn-dwpatches",
    "pointwise",
    "pointwise-dnn",
    "patches",
)
POOL_FORMS = ("phases", "phases-rw", "xla")


class PolicyError(NetError):
    """An engine switch with a value it does not take (one line naming the variable)."""


@dataclass(frozen=True)
class ConvShape:
    """One convolution as the policy sees it: Caffe-order shapes, padding, groups, size."""

    x: tuple[int, ...]  # (N, C, *spatial), leading batch axes folded into N
    w: tuple[int, ...]  # (num_output, C/group, *kernel)
    pad: tuple[int, ...]
    group: int
    macs: int  # forward multiply-adds: each top value sums C/group · kernel terms
    dtype: Any
    channels_last: bool  # the activations are (N, H, W, C) (lowering/layout.py)


@dataclass(frozen=True)
class EnginePolicy:
    """Which engine runs each convolution and pooling (frozen, hashable, compared by value).

    ``conv``: ``auto`` — oneDNN under the size rule where libdnnl loads and the process sees one
    device, XLA elsewhere, silently; ``onednn`` — the size rule on any device count, a warning if
    libdnnl is missing; ``onednn-all`` — every 2-D float32 convolution on oneDNN (no pointwise
    or patches forms); ``xla`` — no oneDNN. The size rule: at least ``onednn_min_macs`` forward
    multiply-adds and more than one input channel; grouped convolutions (depthwise ones,
    ResNeXt's and DPN's) go to oneDNN whatever their size.

    ``pointwise``: on the CPU a channels-last 1×1, unpadded, ungrouped convolution is one
    matrix product over channels; where oneDNN's rule also takes it, its gradients are
    oneDNN's (``pointwise-dnn``: MobileNet-SSD's train step, docs/performance.md).
    ``patches``: on the CPU a channels-last convolution of at
    most ``few_channels`` input channels and ``patches_max_macs`` multiply-adds that oneDNN
    does not take is im2col + one matrix product.

    ``pool``: ``auto`` — ``phases`` on the CPU; elsewhere the forms the GPU table was measured
    with (reduce_window forwards, per-offset selects for non-overlapping MAX windows); ``phases``
    — strided views and phase-sum backwards everywhere (reduce_window forward behind a layer
    whose output is expensive to recompute); ``xla`` — reduce_window and its autodiff (the only
    pooling forward-mode autodiff goes through).

    ``channels_last``: the NHWC pass (lowering/layout.py). ``backend``: the platform the
    ``auto`` rules are resolved for (None: ``jax.default_backend()`` when the net is planned).
    """

    conv: str = "auto"
    # ``onednn``'s size rule: below it, or with one input channel per group (a first layer on
    # grey images), benchmarks/onednn_conv.py --sizes measured XLA's own convolution as fast or
    # faster (fwd+bwd: 2.5M MACs 0.71×, 9.6M 0.85×, 10M 0.82×; 1 input channel 0.12–0.34×; from
    # 19.7M 0.97–1.71×, and 5.95× on a 4×4 image): the pass through Python costs ~0.2 ms a call.
    # Grouped convolutions are outside the rule: XLA:CPU's grouped convolution is slow, backward
    # above all. Depthwise (group = channels; benchmarks/ssd_train.py, MobileNet-SSD train step
    # b4 300×300: 3.50 s → 1.13 s an iteration; MobileNet-v2 SSDLite forward b1 248 → 138 ms)
    # and ResNeXt's/DPN's (group 32–64, 3–24 channels a group, b1 and b8: benchmarks/
    # grouped_conv.py, oneDNN's forward 1.1–13× faster but 0.23× at 24 a group on 7×7, forward
    # + backward 57–1650×; XLA:CPU compiles each grouped backward for 6–137 s).
    onednn_min_macs: int = 16_000_000
    # XLA:CPU otherwise copies a 1×1 kernel into HWIO on every call (benchmarks/fast_paths.py
    # --path pointwise).
    pointwise: bool = True
    # A 1×1 matrix product under oneDNN's size rule takes oneDNN's gradients ("pointwise-dnn"):
    # XLA:CPU transposes both gradient products' operands (benchmarks/op_profile.py ssd).
    pointwise_onednn_grads: bool = True
    # A channels-last, ungrouped oneDNN convolution of a kernel of ≥ 25 taps on a bottom of ≥
    # 256 pixels a plane takes its weight diff on oneDNN's blocked activations ("onednn-
    # blocked", blocked_grads.py): per call 0.47–0.88× at SegNet-basic's 7×7s and a 5×5 at
    # 4×64×72×96, 0.86–0.91× CIFAR-10 quick's 16×16 and 32×32 5×5s; on smaller planes 1.04×
    # (quick's 8×8) and 1.31–1.38× (LeNet's 12×12, 20 channels); 3×3s and 1×1s mixed (0.72–
    # 1.43×): those stay as they are.
    onednn_blocked_weight_grads: bool = True
    blocked_min_taps: int = 25
    blocked_min_pixels: int = 256
    # An ungrouped channels-last oneDNN convolution whose top has at most this many pixels an
    # image and whose patches are at least ``dw_patches_min_depth`` deep (C·kh·kw) takes its
    # weight diff as one matrix product of im2col patches and the top diff ("onednn-dwpatches";
    # 0 pixels: off). CRNN's conv5 and conv6 (28 and 13 pixels, depth 4608 and 2048): oneDNN's
    # backward-weights primitive took 1.5× and 4× that product in the train step (benchmarks/
    # op_profile.py crnn); conv4 (64 pixels) 0.57×, hence 32. Whole step 0.91× (docs/
    # performance.md, "Engine switches").
    dw_patches_max_pixels: int = 32
    dw_patches_min_depth: int = 1024
    # A channels-last BatchNorm (batch statistics) → Scale → ReLU chain in a train step runs as
    # one function whose backward recomputes BatchNorm's top (lowering/engines/chains.py;
    # benchmarks/bn_chain.py: 0.50–0.75× the three layers' time).
    fuse_batch_norm_chains: bool = True
    # ≤ 4 input channels: first layers on RGB or grey images. Up to 64M multiply-adds, where
    # benchmarks/fast_paths.py --path patches measured it ahead (LeNet b64 train 0.90×, CIFAR-10
    # full b1 0.92×); first layers of ImageNet nets measured faster on oneDNN.
    patches: bool = True
    few_channels: int = 4
    patches_max_macs: int = 64_000_000
    # Forward-only programs (pycaffe's Net.forward, ``caffe2jax time``, Model.packed) take the
    # oneDNN convolutions' weights packed once into oneDNN's format (lowering/engines/
    # packing.py) instead of reordering them on every call (GoogLeNet b1 forward: 0.81× the
    # unpacked time, docs/performance.md).
    packed_weights: bool = True
    # ... and, given the state (a whole-net forward), each in-place Convolution → BatchNorm →
    # Scale chain folded into the convolution's weights and bias (lowering/engines/folding.py;
    # ONNX Runtime does the same at session creation; ResNet-50: 53 chains). Off: it changes
    # Caffe's rounding (tops within 1e-5, no longer bit-identical to the unfolded forward) for
    # no measured gain (ResNet-50 b1 quiet, load 1: folded 82.3 ms vs unfolded 80.2 ms; XLA
    # already fuses BatchNorm + Scale + ReLU into one pass after each convolution).
    fold_batchnorm: bool = False
    # ... with a folded chain's bias and ReLU inside its oneDNN primitive (post-ops: lowering/
    # engines/fused.py). Off: per layer (GoogLeNet's 3×3s, b1, alternating calls, load 6)
    # oneDNN's post-ops took 1.01–1.03× the plain call plus XLA's elementwise pass.
    onednn_post_ops: bool = False
    # ... and each oneDNN 3×3 convolution (stride 1, pad 1, sides 8–32) as Winograd's
    # F(2×2, 3×3) in XLA, its weights transformed once (lowering/engines/winograd.py; the top
    # within ~1e-6 of its largest magnitude, not bit for bit). GoogLeNet's 14² and 28² 3×3s:
    # 0.67–0.96× oneDNN's CPU time per layer (benchmarks/inception_forms.py, load 10–11).
    winograd: bool = False
    pool: str = "auto"
    channels_last: bool = True
    backend: str | None = None

    def __post_init__(self):
        _check("conv", self.conv, CONV_SETTINGS)
        _check("pool", self.pool, POOL_SETTINGS)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **fields: Any) -> EnginePolicy:
        """The policy the user's environment variables ask for (others at their defaults,
        ``fields`` overriding); a value a switch does not take is refused by name."""
        conv = environment.value(CONV_ENV, environ).strip().lower() or "auto"
        if conv not in CONV_SETTINGS:
            raise PolicyError(f"${CONV_ENV}={conv!r}: use one of {', '.join(CONV_SETTINGS)}")
        pool = environment.value(POOL_ENV, environ).strip().lower() or "auto"
        if pool not in POOL_SETTINGS:
            raise PolicyError(f"${POOL_ENV}={pool!r}: use {', '.join(POOL_SETTINGS[:-1])} or xla")
        last = environment.value(CHANNELS_LAST_ENV, environ).strip().lower()
        if last and last not in _TRUE + _FALSE:
            raise PolicyError(f"${CHANNELS_LAST_ENV}={last!r}: use 1 or 0")
        return cls(**{"conv": conv, "pool": pool, "channels_last": last not in _FALSE, **fields})

    # -- the choices, made when a graph is planned ---------------------------------------------

    def on_cpu(self) -> bool:
        return (self.backend or jax.default_backend()) == "cpu"

    def conv_form(self, c: ConvShape) -> str:
        """The form a convolution runs in (one of :data:`CONV_FORMS`)."""
        if c.channels_last and self._pointwise(c):
            dnn = self.pointwise_onednn_grads and self._onednn(c)
            return "pointwise-dnn" if dnn else "pointwise"
        if self._onednn(c):
            if c.channels_last and self._dw_patches(c):
                return "onednn-dwpatches"
            big = np.prod(c.w[2:]) >= self.blocked_min_taps
            big = big and np.prod(c.x[2:]) >= self.blocked_min_pixels and len(c.x) == 4
            blocked = self.onednn_blocked_weight_grads and c.channels_last and c.group == 1
            return "onednn-blocked" if blocked and big else "onednn"
        if c.channels_last and self._patches(c):
            return "patches"
        return "xla"

    def _pointwise(self, c: ConvShape) -> bool:
        """A 1×1, unpadded, ungrouped 2-D convolution on the CPU (``onednn-all`` takes all)."""
        return (
            self.pointwise
            and self.conv != "onednn-all"
            and c.group == 1
            and c.w[2:] == (1, 1)
            and not any(c.pad)
            and self.on_cpu()
        )

    def _onednn(self, c: ConvShape) -> bool:
        """oneDNN's path: not turned off, on the CPU, 2-D, float32, the size rule (or
        ``onednn-all``), and the library loads (if it does not and was asked for by name, say
        so once). By default (``auto``) only in a process that sees one device: XLA's SPMD
        partitioner has no rule for the foreign call, so a sharded program would gather the
        whole batch onto every device."""
        if self.conv == "xla" or not self.on_cpu() or len(c.x) != 4:
            return False
        if self.conv == "auto" and jax.device_count() > 1:
            return False
        if self.conv != "onednn-all" and c.group == 1:  # grouped: oneDNN at any size
            if c.macs < self.onednn_min_macs or c.w[1] <= 1:
                return False
        if np.dtype(c.dtype) != np.float32:
            return False
        why = onednn.available()
        if why is not None and self.conv != "auto":
            _warn_once(why)
        return why is None

    def _dw_patches(self, c: ConvShape) -> bool:
        """Ungrouped, at most ``dw_patches_max_pixels`` top pixels an image (MACs over the
        multiply-adds of one pixel), patches at least ``dw_patches_min_depth`` deep."""
        depth = int(np.prod(c.w[1:]))
        small = c.macs <= self.dw_patches_max_pixels * c.x[0] * c.w[0] * depth
        deep = depth >= self.dw_patches_min_depth
        return small and deep and c.group == 1 and self.conv != "onednn-all"

    def _patches(self, c: ConvShape) -> bool:
        return (
            self.patches
            and self.few_channels > 0
            and c.macs <= self.patches_max_macs
            and self.conv != "onednn-all"
            and c.group == 1
            and c.w[1] <= self.few_channels
            and c.w[2:] != (1, 1)
            and self.on_cpu()
        )

    def pool_form(self, op: str, kernel: tuple, stride: tuple, expensive_bottom: bool) -> str:
        """The form of a MAX (``op="max"``) or AVE pooling (one of :data:`POOL_FORMS`).

        ``expensive_bottom``: its bottom comes from a layer whose output costs exp, log or pow
        per element; XLA:CPU fuses such a producer into each of the k_h·k_w window views and
        computes it that many times (AlexNet b1: 1.2× slower), so there the forward reads its
        input once, through reduce_window."""
        setting = self.pool
        if setting == "auto" and self.on_cpu():
            setting = "phases"
        if setting == "phases":
            return "phases-rw" if expensive_bottom else "phases"
        if setting == "auto" and op == "max" and all(k <= s for k, s in zip(kernel, stride)):
            return "phases-rw"  # off the CPU: per-offset selects where windows do not overlap
        return "xla"


def resolve(policy: EnginePolicy | None) -> EnginePolicy:
    """``policy``, or when None the one the environment asks for."""
    return EnginePolicy.from_env() if policy is None else policy


def _check(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise PolicyError(f"engine policy {name}={value!r}: use one of {', '.join(allowed)}")


@functools.cache
def _warn_once(why: str) -> None:
    warnings.warn(f"{why}; convolving with XLA instead", RuntimeWarning, stacklevel=4)
