"""`caffe2jax time --profile DIR` (runtime/tools/profiling.py): per-layer lines from one profile
of the fused forward-backward program, each layer's ops found by the `jax.named_scope` the
graph puts them under. Timings are never asserted: only that every layer gets its lines, that
the figures add up (the layers' sum within the program's op time, that within its wall time
on the threads that ran it) and that a bad folder is one clean line."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from caffe2jax.frontend.errors import CaffeError
from caffe2jax.lowering.model import compile as compile_net
from caffe2jax.runtime.tools.profiling import instruction_scopes, scope_matcher, writable_folder
from caffe2jax.runtime.tools.timing import random_inputs, time_net
from tests.cli.test_timing import ALIKE, LAYERS, NET

NUMBER = r"[0-9.e+-]+"


def run_time(tmp_path, *time_args):
    model = tmp_path / "tiny.prototxt"
    model.write_text(NET)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "caffe2jax", "time", "--model", str(model), "--iterations", "3",
         *time_args],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "CAFFE2JAX_CACHE_DIR": str(tmp_path / "cache"),
             "TMPDIR": str(tmp_path / "tmp")},
    )  # fmt: skip


def layer_lines(stderr: str) -> dict[tuple[str, str], float]:
    found = {}
    for line in stderr.splitlines():
        m = re.match(rf"^.*\] +(\S+)\t(forward|backward): ({NUMBER}) ms\.$", line)
        if m:
            found[m.group(1), m.group(2)] = float(m.group(3))
    return found


def test_profile_dir_is_written_and_every_layer_gets_its_lines(tmp_path):
    done = run_time(tmp_path, "--profile", str(tmp_path / "prof"))
    assert done.returncode == 0, done.stderr
    runs = list((tmp_path / "prof" / "plugins" / "profile").iterdir())
    assert len(runs) == 1
    names = {p.name for p in runs[0].iterdir()}
    assert any(n.endswith(".xplane.pb") for n in names), names  # TensorBoard's profile plugin
    assert "perfetto_trace.json.gz" in names, names
    lines = layer_lines(done.stderr)
    assert set(lines) == {(n, side) for n in LAYERS for side in ("forward", "backward")}
    # the layers whose ops the loss needs ran some; splits and Accuracy (its top unread) none
    for name in ("conv", "ip", "loss"):
        assert lines[name, "forward"] > 0 and lines[name, "backward"] > 0, name
    assert lines["acc", "forward"] == lines["acc", "backward"] == 0
    total = re.search(rf"Average Forward-Backward: ({NUMBER}) ms\.", done.stderr)
    summed = sum(lines.values())
    assert total and abs(float(total.group(1)) - summed) <= 1e-3 * summed + 1e-4
    assert "one profile of the fused forward-backward program" in done.stderr
    assert f"Profile written to {runs[0]}" in done.stderr


def test_per_layer_sum_is_bounded_by_the_whole_program(tmp_path):
    model = compile_net(NET, "TRAIN")
    t = time_net(model, random_inputs(model), iterations=3, per_layer=False,
                 profile=tmp_path)  # fmt: skip
    p = t.profile
    assert [x.name for x in t.layers] == LAYERS
    layers = t.forward_ms + t.backward_ms
    assert layers > 0 and p.ops > 0
    assert layers + p.outside_ms == pytest.approx(p.ops_ms, rel=1e-9)
    # op events of one run lie within its span, and one thread runs one op at a time
    assert p.ops_ms <= p.span_ms * p.threads * (1 + 1e-9)
    assert p.span_ms <= p.wall_ms


def test_default_lines_come_from_a_temporary_profile_and_programs_by_flag(tmp_path):
    done = run_time(tmp_path)
    assert done.returncode == 0, done.stderr
    assert set(layer_lines(done.stderr)) == {
        (n, s) for n in LAYERS for s in ("forward", "backward")
    }
    assert "one profile of the fused" in done.stderr and "Profile written" not in done.stderr
    assert not list((tmp_path / "tmp").glob("caffe2jax-profile-*"))  # the profile removed
    programs = run_time(tmp_path, "--per-layer-programs")
    assert programs.returncode == 0, programs.stderr
    assert "compiled per-layer programs" in programs.stderr
    assert "one profile" not in programs.stderr
    assert set(layer_lines(programs.stderr)) == set(layer_lines(done.stderr))


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_a_bad_profile_dir_is_one_line_and_a_failure(tmp_path, where):
    blocker = tmp_path / "taken"
    blocker.write_text("the user's file")
    target = blocker if where == "file" else blocker / "sub"
    done = run_time(tmp_path, "--profile", str(target))
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    errors = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and f"--profile {target}" in errors[0], done.stderr
    assert blocker.read_text() == "the user's file"
    with pytest.raises(CaffeError):
        writable_folder(target)


def test_alike_nets_keep_their_own_layer_names_through_the_compile_cache(tmp_path):
    """JAX's persistent-cache key leaves op names out: a net alike in all but its layer names
    must not come back with the first net's scopes."""
    renamed = ALIKE.replace('"conv', '"c').replace('"relu', '"r')
    for text, convs in ((ALIKE, {"conv1", "conv2", "conv3"}), (renamed, {"c1", "c2", "c3"})):
        model = compile_net(text, "TEST")
        t = time_net(model, random_inputs(model), iterations=2, per_layer=False,
                     profile=tmp_path / min(convs))  # fmt: skip
        ran = {x.name for x in t.layers if x.forward_ms > 0}
        assert convs <= ran, ran
        assert t.profile.outside_ms < t.profile.ops_ms


def test_scopes_name_layers_with_slashes_and_sides():
    match = scope_matcher(["inception_3a/1x1", "inception_3a/relu_1x1", "loss", "conv"])
    assert match("jit(loss)/jvp(jit(apply))/inception_3a/1x1/conv_general_dilated") == (
        "inception_3a/1x1", False)  # fmt: skip
    assert match("jit(loss)/transpose(jvp(inception_3a/relu_1x1))/select_n") == (
        "inception_3a/relu_1x1", True)  # fmt: skip
    assert match("jit(loss)/jvp()/reduce_sum") is None  # the jit's own name is no layer
    assert match("jit(loss)/jvp(conv)/jit(loss_fn)/add") == ("conv", False)


HLO = """HloModule jit_loss, entry_computation_layout={()->f32[]}

%fused_computation (param_0: f32[4]) -> f32[4] {
  %param_0 = f32[4]{0} parameter(0)
  ROOT %maximum = f32[4]{0} maximum(%param_0, %param_0), metadata={op_name="jit(loss)/jvp(relu)/max"}
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0), metadata={op_name="x"}
  %convolution = f32[4]{0} convolution(%x, %x), metadata={op_name="jit(loss)/transpose(jvp(a/b))/conv"}
  %fusion = f32[4]{0} fusion(%convolution), kind=kLoop, calls=%fused_computation
  ROOT %wrapped_copy = f32[4]{0} copy(%convolution)
}
"""  # noqa: E501


def test_ops_without_metadata_take_their_callees_then_their_operands_scope():
    scopes, entry = instruction_scopes(HLO, ["a/b", "relu", "a"])
    assert entry == ["x", "convolution", "fusion", "wrapped_copy"]
    assert scopes["convolution"] == ("a/b", True)
    assert scopes["fusion"] == ("relu", False)  # its fused computation's root
    assert scopes["wrapped_copy"] == ("a/b", True)  # its operand's
    assert scopes["x"] is None
