"""A big program's first run (runtime/host/first_run.py): the first call runs an executable
compiled at LLVM -O0 while the optimised one compiles in a background thread, later calls
switch to it; both give bit-identical results through a pycaffe net's forward as users run it
(the start-up cache's program on a first run) and for a bare jitted function, and each
elementwise operation XLA compiles differently at -O0 stays within float rounding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import caffe2jax
from caffe2jax.runtime.host import first_run, startup_cache

# convolutions (a grouped one: oneDNN's custom call at any size), LRN, both poolings, a
# concat, an inner product, softmax
NET = """
name: "mini_inception"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 2 dim: 3 dim: 20 dim: 20 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 16 kernel_size: 3 pad: 1 weight_filler { type: "xavier" }
                      bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "norm1" type: "LRN" bottom: "conv1" top: "norm1"
  lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 } }
layer { name: "pool1" type: "Pooling" bottom: "norm1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "a" type: "Convolution" bottom: "pool1" top: "a"
  convolution_param { num_output: 32 kernel_size: 3 pad: 1 group: 4
                      weight_filler { type: "xavier" } } }
layer { name: "b" type: "Convolution" bottom: "pool1" top: "b"
  convolution_param { num_output: 8 kernel_size: 1 weight_filler { type: "xavier" } } }
layer { name: "relu_b" type: "ReLU" bottom: "b" top: "b" }
layer { name: "cat" type: "Concat" bottom: "a" bottom: "b" top: "cat" }
layer { name: "pool2" type: "Pooling" bottom: "cat" top: "pool2"
  pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool2" top: "ip"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CAFFE2JAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CAFFE2JAX_NO_COMPILE_CACHE", raising=False)
    monkeypatch.delenv(first_run.SWITCH_ENV, raising=False)
    monkeypatch.setattr(first_run, "MIN_OPS", 0)  # the small net counts as big
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    return str(path)


def _forward(path: str):
    net = caffe2jax.Net(path, caffe2jax.TEST, seed=0)
    data = np.random.default_rng(0).normal(size=net.blobs["data"].shape)
    net.blobs["data"].data[...] = data
    first = {k: np.array(v) for k, v in net.forward(blobs=["pool2"]).items()}
    programs = [p for p in net.model.programs.values() if isinstance(p, startup_cache.Program)]
    return net, first, programs


def test_first_forward_runs_quick_then_optimised_bit_identical(cache, monkeypatch):
    net, first, programs = _forward(cache)
    (program,) = programs
    tiered = program.tiered
    assert isinstance(tiered, first_run.Tiered) and not program.loaded
    tiered.wait()
    assert tiered.optimised is not None and tiered.failed is None
    second = {k: np.array(v) for k, v in net.forward(blobs=["pool2"]).items()}  # optimised
    monkeypatch.setenv("CAFFE2JAX_NO_COMPILE_CACHE", "1")  # the plain jax.jit path
    plain_net, plain, plain_programs = _forward(cache)
    assert plain_programs == []
    plain_second = {k: np.array(v) for k, v in plain_net.forward(blobs=["pool2"]).items()}
    for name in ("prob", "pool2"):
        np.testing.assert_array_equal(first[name], plain[name])
        np.testing.assert_array_equal(second[name], plain_second[name])


def test_switched_off_or_loaded_programs_compile_once(cache, monkeypatch):
    monkeypatch.setenv(first_run.SWITCH_ENV, "0")
    _, _, (program,) = _forward(cache)
    assert program.tiered is program.compiled  # the exported program, jitted as usual
    monkeypatch.delenv(first_run.SWITCH_ENV)
    _, _, (loaded,) = _forward(cache)  # a second run: the optimised executable from the cache
    assert loaded.loaded and loaded.tiered is None


def test_small_programs_are_not_tiered(monkeypatch):
    monkeypatch.delenv(first_run.SWITCH_ENV, raising=False)
    jitted = jax.jit(lambda x: jnp.tanh(x) * 2)
    args = (jnp.ones((3, 4)),)
    assert first_run.first_call(jitted, args) is None  # a handful of ops, < MIN_OPS
    monkeypatch.setattr(first_run, "MIN_OPS", 1)
    tiered = first_run.first_call(jitted, args)
    np.testing.assert_array_equal(tiered(*args), jitted(*args))  # the quick executable
    tiered.wait()
    assert tiered(*args) is not None and tiered.optimised is not None
    np.testing.assert_array_equal(tiered(*args), jitted(*args))


def test_a_quick_compile_that_fails_leaves_the_usual_compile(monkeypatch):
    monkeypatch.delenv(first_run.SWITCH_ENV, raising=False)
    monkeypatch.setattr(first_run, "MIN_OPS", 1)
    monkeypatch.setattr(first_run, "QUICK_OPTIONS", {"xla_no_such_option": 0})
    monkeypatch.setattr(first_run, "FALLBACK_OPTIONS", {"xla_no_such_option": 1})
    jitted = jax.jit(lambda x: jnp.tanh(x) * 3)
    assert first_run.first_call(jitted, (jnp.ones((3, 4)),)) is None


def test_a_refused_quick_option_falls_back_to_llvm_o0(monkeypatch):
    monkeypatch.delenv(first_run.SWITCH_ENV, raising=False)
    monkeypatch.setattr(first_run, "MIN_OPS", 1)
    monkeypatch.setattr(first_run, "QUICK_OPTIONS", {"xla_no_such_option": 0})
    jitted = jax.jit(lambda x: jnp.tanh(x) * 3)
    tiered = first_run.first_call(jitted, (jnp.ones((3, 4)),))
    tiered.wait()
    np.testing.assert_array_equal(tiered.quick(jnp.ones((3, 4))), jitted(jnp.ones((3, 4))))


def _elementwise(x):
    """Operations the quick executable computes differently: products then sums (fused
    multiply-adds at -O2 only), divisions, and the elemental emitter's own tanh, rsqrt, log1p."""
    a = jnp.abs(x)
    return (
        jnp.tanh(x),
        jax.lax.rsqrt(a + 1e-3),
        jnp.log1p(a),
        x / (x * x + 1),
        jax.nn.softplus(x),
        jnp.exp(-a) * x + 0.5 * x,
        (1 + a) ** -0.75,
        jax.nn.sigmoid(x),
    )


def test_quick_executable_within_float_rounding_of_the_optimised():
    x = np.random.default_rng(0).normal(size=50_000).astype(np.float32) * np.float32(4)
    lowered = jax.jit(_elementwise).lower(x)
    optimised = lowered.compile()(x)
    quick = lowered.compile(first_run.QUICK_OPTIONS)(x)
    differ = 0
    for q, o in zip(quick, optimised):
        # measured at most 8 ulp (tanh: the elemental emitter's own approximation), most 0-2:
        # 1e-6 relative is 8.4 float32 ulp at worst
        np.testing.assert_allclose(np.asarray(q), np.asarray(o), rtol=1e-6, atol=1e-30)
        differ += int(np.sum(np.asarray(q) != np.asarray(o)))
    assert differ > 0  # the check sees the executables' differences (not one program twice)


def test_the_optimised_compile_starts_after_the_first_calls_result(monkeypatch):
    monkeypatch.delenv(first_run.SWITCH_ENV, raising=False)
    monkeypatch.setattr(first_run, "MIN_OPS", 1)
    jitted = jax.jit(lambda x: jnp.exp(x) * 2)
    args = (jnp.ones((3, 4)),)
    tiered = first_run.first_call(jitted, args)
    assert tiered.thread.ident is None and tiered.optimised is None  # not beside the first run
    np.testing.assert_array_equal(tiered(*args), jitted(*args))
    assert tiered.thread.ident is not None  # started once the first result was ready
    tiered.wait()
    assert tiered.optimised is not None
