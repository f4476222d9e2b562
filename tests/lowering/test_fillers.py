"""Caffe's fillers against the real-Caffe goldens in golden/fillers.

``constant`` and ``bilinear`` are deterministic: ours must equal Caffe's bit for bit. The
random fillers come from Caffe's RNG, so each is checked as a distribution, twice: our draws
and Caffe's own values must both fit the distribution Caffe's filler.hpp states.

Statistical tolerances (n = 12,800 values per weight blob unless said otherwise):

- Kolmogorov–Smirnov: by the Dvoretzky–Kiefer–Wolfowitz inequality P(D > ε) ≤ 2·exp(−2nε²);
  ε = sqrt(ln(2/α) / 2n) with α = 1e-6 gives ε ≈ 0.024 at n = 12,800. A false failure has
  probability below 1e-6 whatever the seed; a wrong scale (say fan_in for fan_out) moves the
  CDF by far more.
- Mean and std: 5 standard errors. SE(mean) = σ/√n; SE(std) ≈ σ·sqrt((κ − 1)/4n) with
  kurtosis κ = 3 (normal) or 1.8 (uniform). Two-sided 5σ: false-failure probability ≈ 6e-7.
- Bounds of U(a, b): every value in [a, b], and the extremes within 20(b − a)/n of the bounds
  (each misses with probability (1 − 20/n)^n ≈ e^−20).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from google.protobuf import text_format

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import NetError
from caffe2jax.lowering.fillers import fill
from tests.golden import GOLDEN, load_npz, require

FILLERS = require(GOLDEN / "fillers")
ALPHA = 1e-6
# The golden weight blob (64, 8, 5, 5): fan_in = 8·25 = 200, fan_out = 64·25 = 1600.
FAN_IN, FAN_OUT = 200.0, 1600.0


def golden(name: str):
    """(weight FillerParameter, bias FillerParameter or None, arrays) of golden case ``name``."""
    arrays, _ = load_npz(FILLERS / f"filler_{name}.npz")
    net = text_format.Parse(str(arrays["prototxt"]), caffe_pb2.NetParameter())
    layer = next(layer for layer in net.layer if layer.name == "layer")
    p = layer.inner_product_param if layer.type == "InnerProduct" else layer.convolution_param
    bias = p.bias_filler if p.HasField("bias_filler") else None
    return p.weight_filler, bias, arrays


def ours(filler, shape, seed=0, dtype=jnp.float32) -> np.ndarray:
    return np.asarray(fill(filler, tuple(shape), jax.random.key(seed), dtype))


def both(name: str):
    """Caffe's weight values and ours, drawn for the same filler and shape."""
    filler, _, arrays = golden(name)
    caffe = arrays["param__0"]
    return [("caffe", caffe), ("ours", ours(filler, caffe.shape, seed=len(name)))]


def dkw_eps(n: int) -> float:
    return math.sqrt(math.log(2 / ALPHA) / (2 * n))


def ks_stat(values: np.ndarray, cdf) -> float:
    x = np.sort(np.asarray(values, np.float64).ravel())
    n = x.size
    f = cdf(x)
    return float(max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n)))


def normal_cdf(mean, std):
    erf = np.vectorize(math.erf)
    return lambda x: 0.5 * (1 + erf((x - mean) / (std * math.sqrt(2))))


def check_moments(who, values, mean, std, kurtosis):
    v = np.asarray(values, np.float64).ravel()
    n = v.size
    se_mean = std / math.sqrt(n)
    se_std = std * math.sqrt((kurtosis - 1) / (4 * n))
    assert abs(v.mean() - mean) < 5 * se_mean, f"{who}: mean {v.mean()} vs {mean}"
    assert abs(v.std() - std) < 5 * se_std, f"{who}: std {v.std()} vs {std}"


def check_normal(who, values, mean, std):
    check_moments(who, values, mean, std, kurtosis=3.0)
    d = ks_stat(values, normal_cdf(mean, std))
    assert d < dkw_eps(values.size), f"{who}: KS distance {d} from N({mean}, {std}²)"


def check_uniform(who, values, a, b):
    v = np.asarray(values, np.float64).ravel()
    n = v.size
    assert v.min() >= a and v.max() <= b, f"{who}: values outside [{a}, {b}]"
    slack = 20 * (b - a) / n
    assert v.min() - a < slack and b - v.max() < slack, f"{who}: extremes far from the bounds"
    check_moments(who, v, (a + b) / 2, (b - a) / math.sqrt(12), kurtosis=1.8)
    d = ks_stat(v, lambda x: (x - a) / (b - a))
    assert d < dkw_eps(n), f"{who}: KS distance {d} from U({a}, {b})"


# --- deterministic fillers: exact ------------------------------------------------------------


@pytest.mark.parametrize("name", ["constant", "bilinear"])
def test_deterministic_fillers_equal_caffe_exactly(name):
    filler, _, arrays = golden(name)
    caffe = arrays["param__0"]
    mine = ours(filler, caffe.shape)
    assert mine.dtype == np.float32
    np.testing.assert_array_equal(mine, caffe)


@pytest.mark.parametrize(
    "name",
    sorted(p.stem.removeprefix("filler_") for p in FILLERS.glob("filler_*.npz")),
)
def test_constant_biases_equal_caffe_exactly(name):
    _, bias, arrays = golden(name)
    if bias is None:
        assert "param__1" not in arrays
        return
    np.testing.assert_array_equal(ours(bias, arrays["param__1"].shape), arrays["param__1"])


def test_bilinear_odd_kernel_is_symmetric_and_float64_exact():
    """Upstream's c = (k − 1)/(2f): for k = 3 the kernel is [½, 1, ½] ⊗ [½, 1, ½]."""
    filler = caffe_pb2.FillerParameter(type="bilinear")
    one = np.array([0.5, 1.0, 0.5])
    for dtype in (jnp.float32, jnp.float64):
        with jax.enable_x64(dtype == jnp.float64):
            k = ours(filler, (2, 1, 3, 3), dtype=dtype)
        assert k.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(k[0, 0], np.outer(one, one))
        np.testing.assert_array_equal(k[1, 0], k[0, 0])


# --- random fillers: Caffe's values and ours fit the stated distribution ---------------------


def test_gaussian():
    for who, values in both("gaussian"):  # mean 0.2, std 0.5
        check_normal(who, values, 0.2, 0.5)


def test_uniform():
    for who, values in both("uniform"):  # min -0.3, max 0.6
        check_uniform(who, values, -0.3, 0.6)


@pytest.mark.parametrize(
    ("name", "n"),
    [("xavier_fan_in", FAN_IN), ("xavier_fan_out", FAN_OUT), ("xavier_average", 900.0)],
)
def test_xavier_fan_rules(name, n):
    """U(−a, a), a = sqrt(3/n); n = fan_in, fan_out or their mean (900)."""
    a = math.sqrt(3.0 / n)
    for who, values in both(name):
        check_uniform(who, values, -a, a)


@pytest.mark.parametrize(
    ("name", "n"),
    [("msra_fan_in", FAN_IN), ("msra_fan_out", FAN_OUT), ("msra_average", 900.0)],
)
def test_msra_fan_rules(name, n):
    """N(0, 2/n); n = fan_in, fan_out or their mean (900)."""
    for who, values in both(name):
        check_normal(who, values, 0.0, math.sqrt(2.0 / n))


def test_positive_unitball():
    """U(0, 1) then each item (axis-0 slice) divided by its sum.

    Rows sum to 1; and within a row, value / row max (the max itself left out) is exactly
    i.i.d. U(0, 1) again, whatever the row's sum: KS on 64·199 = 12,736 such ratios.
    """
    for who, values in both("positive_unitball"):
        rows = np.asarray(values, np.float64).reshape(values.shape[0], -1)
        assert rows.min() >= 0, who
        np.testing.assert_allclose(rows.sum(axis=1), 1.0, rtol=1e-5, err_msg=who)
        order = np.sort(rows, axis=1)
        ratios = order[:, :-1] / order[:, -1:]
        d = ks_stat(ratios, lambda x: x)
        assert d < dkw_eps(ratios.size), f"{who}: KS distance {d} of within-row ratios"


def test_gaussian_sparse():
    """N(0, 1) times an i.i.d. Bernoulli(sparse / shape[0]) mask, as Caffe's GaussianFiller.

    Blob (200, 100), sparse 5: keep probability p = 5/200 = 0.025, so Caffe keeps on average
    100·p = 2.5 weights per output row (not ``sparse`` of them).
    - Non-zero count ~ Binomial(20,000, p): mean 500, sd 22.1; allowed ±5 sd.
    - The per-row counts are Binomial(100, p): variance σ² = 2.44, fourth central moment
      μ4 ≈ σ² + 3σ⁴ = 20.3. Over 200 rows the sample variance has SE ≈ sqrt((μ4 − σ⁴)/200)
      ≈ 0.27; allowed ±1.5 (5.5 SE), far from the 0 a fixed count per row would give.
    - The kept values (about 500) are N(0, 1): KS with ε = sqrt(ln(2e6)/1000) ≈ 0.12.
    """
    filler, _, _ = golden("gaussian_sparse")
    p = filler.sparse / 200
    for who, values in both("gaussian_sparse"):
        assert values.shape == (200, 100)
        nonzero = values != 0
        expected, sd = values.size * p, math.sqrt(values.size * p * (1 - p))
        assert abs(nonzero.sum() - expected) < 5 * sd, f"{who}: {nonzero.sum()} non-zeros"
        per_row = nonzero.sum(axis=1)
        assert abs(per_row.var() - 100 * p * (1 - p)) < 1.5, f"{who}: row count variance"
        kept = values[nonzero]
        d = ks_stat(kept, normal_cdf(0.0, 1.0))
        assert d < dkw_eps(kept.size), f"{who}: KS distance {d} of the kept weights"


# --- configurations Caffe refuses -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "shape", "message"),
    [
        ({"type": "uniform", "sparse": 3}, (4, 4), "does not support 'sparse'"),
        ({"type": "xavier", "sparse": 0}, (4, 4), "does not support 'sparse'"),
        ({"type": "gaussian", "sparse": 9}, (4, 4), "exceeds the blob's first axis"),
        ({"type": "gaussian", "sparse": -2}, (4, 4), "must be -1"),
        ({"type": "gaussian", "std": 0.0}, (4, 4), "std > 0"),
        ({"type": "uniform", "min": 1.0, "max": 0.0}, (4, 4), "min <= max"),
        ({"type": "bilinear"}, (2, 2, 3, 4), "square kernels"),
        ({"type": "bilinear"}, (4, 4), "4-D blob"),
        ({"type": "orthogonal"}, (4, 4), "unknown filler type 'orthogonal'"),
    ],
)
def test_refused_configurations(fields, shape, message):
    with pytest.raises(NetError, match=message):
        fill(caffe_pb2.FillerParameter(**fields), shape, jax.random.key(0))


def test_sparse_works_on_one_axis_blobs_and_zero_keeps_nothing():
    """Caffe needs only one axis for a sparse gaussian; sparse 0 zeroes every weight."""
    dense = caffe_pb2.FillerParameter(type="gaussian", sparse=10)
    assert ours(dense, (10,)).shape == (10,)
    assert np.all(ours(dense, (10,)) != 0)  # p = 10/10 keeps all
    none = caffe_pb2.FillerParameter(type="gaussian", sparse=0)
    assert not np.any(ours(none, (6, 3)))


@pytest.mark.parametrize("kind", ["xavier", "msra", "gaussian", "uniform", "constant"])
def test_zero_size_blob_fills_nothing(kind):
    """A blob with a 0 axis (``dim: -0`` in a prototxt) has no values: xavier/msra's
    sqrt(3 / fan) must not divide by its zero fan."""
    out = fill(caffe_pb2.FillerParameter(type=kind), (2, 0, 3, 3), jax.random.key(0))
    assert out.shape == (2, 0, 3, 3)
