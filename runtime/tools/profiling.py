"""Caffe's per-layer ``time`` lines from one profile of the fused forward-backward program.

Caffe times each layer's Forward and Backward call. A compiled net is one XLA program, so the
per-layer figures come from the profiler instead: ``jax.profiler`` traces the program's runs
(TensorBoard's and Perfetto's format, written to a folder), every op XLA ran is an event named
after its HLO instruction, and every instruction carries the ``op_name`` of the JAX code it came
from, under the ``jax.named_scope`` of its Caffe layer (lowering/graph.py names each layer's
scope). Forward ops of a ``value_and_grad`` program sit under ``jvp(layer)``, backward ops under
``transpose(jvp(layer))``. An instruction XLA made without metadata (a layout copy, a fusion)
takes the scope of the instructions it calls, else of its first operand that has one; what
still has none (the loss's sum, the gradients' additions at a fork) is reported as outside the
layers. A fusion that XLA made of two layers' ops counts for the layer of its root op.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax

from caffe2jax.frontend.errors import CaffeError

Scope = tuple[str, bool]  # (Caffe layer name, whether the op is of the backward)


@dataclass
class LayerProfile:
    """Per-iteration milliseconds by layer, as the profile attributes the program's ops."""

    forward_ms: dict[str, float] = field(default_factory=dict)
    backward_ms: dict[str, float] = field(default_factory=dict)
    outside_ms: float = 0.0  # ops under no layer's scope
    ops_ms: float = 0.0  # every op of the program: the layers' sum plus ``outside_ms``
    span_ms: float = 0.0  # from the program's first op's start to its last op's end
    wall_ms: float = 0.0  # each call of the program while it was profiled, results waited for
    threads: int = 1  # how many threads ran the program's ops
    ops: int = 0  # the program's instructions that ran
    trace: Path | None = None  # the .xplane.pb written


def writable_folder(path: str | Path, flag: str = "--profile") -> Path:
    """``path`` as a folder the profiler can write into (created if missing); a
    :class:`CaffeError` naming it when it is a file or cannot be written."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise CaffeError(f"{flag} {path}: is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise CaffeError(f"{flag} {path}: cannot write there ({err.strerror or err})") from None
    return folder


_KEYED = "jax_compilation_cache_include_metadata_in_key"


@contextlib.contextmanager
def metadata_keyed(on: bool = True) -> Iterator[None]:
    """Programs compiled inside key the persistent compilation cache on their metadata too.
    JAX's key leaves the op names out, so a program cached before (by an older build, or for a
    net alike in all but its layer names) would come back with another net's scopes."""
    old = getattr(jax.config, _KEYED, None)
    if not on or old is None:
        yield
        return
    jax.config.update(_KEYED, True)
    try:
        yield
    finally:
        jax.config.update(_KEYED, old)


_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([^\s=]+)\s*=\s*(.*)$")
_HEADER = re.compile(r"^(ENTRY\s+)?%([^\s(]+)\s.*\{\s*$")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_REF = re.compile(r"%([\w.\-]+)")


def scope_matcher(layer_names: Iterable[str]) -> Callable[[str], Scope | None]:
    """``op_name`` → (layer, backward): the outermost scope naming one of the layers (the
    longest name where several match, as GoogLeNet's ``inception_3a/1x1`` holds a slash)."""
    names = sorted(set(layer_names), key=len, reverse=True)
    if not names:
        return lambda op_name: None
    pattern = re.compile(r"(?:^|[/(])(" + "|".join(map(re.escape, names)) + r")(?=[/)])")

    def match(op_name: str) -> Scope | None:
        stack = re.sub(r"^jit\([^)]*\)/", "", op_name)
        found = pattern.search(stack)
        return None if found is None else (found.group(1), "transpose(" in stack)

    return match


def instruction_scopes(hlo_text: str, layer_names: Iterable[str]) -> tuple[dict, list[str]]:
    """Each instruction of an optimized HLO module → its :data:`Scope` (None: none found),
    and the names of the entry computation's instructions (the ops whose events count)."""
    match = scope_matcher(layer_names)
    scopes: dict[str, Scope | None] = {}
    roots: dict[str, Scope | None] = {}  # computation → its root's scope, else its first
    entry: list[str] = []
    computation, in_entry = None, False
    for line in hlo_text.splitlines():
        header = _HEADER.match(line)
        if header:
            computation, in_entry = header.group(2), bool(header.group(1))
            continue
        instr = _INSTR.match(line)
        if instr is None or computation is None:
            continue
        name, body = instr.groups()
        op_name = _OP_NAME.search(body)
        scope = match(op_name.group(1)) if op_name else None
        if scope is None:  # what it calls, else its operands
            refs = _REF.findall(_OP_NAME.sub("", body))
            scope = next((roots[r] for r in refs if roots.get(r)), None) or next(
                (scopes[r] for r in refs if scopes.get(r)), None)  # fmt: skip
        scopes[name] = scope
        root = line.lstrip().startswith("ROOT")
        roots[computation] = scope if root and scope else roots.get(computation) or scope
        if in_entry:
            entry.append(name)
    return scopes, entry


def op_times(xplane: Path, module: str) -> tuple[dict[str, float], float, int, int]:
    """Nanoseconds per HLO instruction of ``module`` summed over the profile's events, the
    summed span of its runs, how many runs and how many threads ran its ops. Device planes
    count where there are any (a GPU), else the host's (XLA:CPU's thunks)."""
    planes = list(jax.profiler.ProfileData.from_file(str(xplane)).planes)
    device = [p for p in planes if p.name.startswith("/device:")]
    times: dict[str, float] = defaultdict(float)
    runs: dict[Any, list[float]] = {}
    threads = set()
    for plane in device or [p for p in planes if p.name.startswith("/host:")]:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if stats.get("hlo_module") != module or "hlo_op" not in stats:
                    continue
                times[stats["hlo_op"]] += event.duration_ns
                threads.add((plane.name, line.name))
                span = runs.setdefault(stats.get("run_id"), [event.start_ns, event.end_ns])
                span[0], span[1] = min(span[0], event.start_ns), max(span[1], event.end_ns)
    total_span = sum(end - start for start, end in runs.values())
    return dict(times), total_span, len(runs), len(threads)


def attribute(times: dict[str, float], scopes: dict, entry: Sequence[str], runs: int,
              layers: Iterable[str]) -> LayerProfile:  # fmt: skip
    """Per-iteration milliseconds of each layer's forward and backward ops."""
    out = LayerProfile()
    out.forward_ms = {name: 0.0 for name in layers}
    out.backward_ms = dict(out.forward_ms)
    per = 1e-6 / max(runs, 1)
    for name in entry:
        if name not in times:
            continue
        ms = times[name] * per
        out.ops += 1
        out.ops_ms += ms
        scope = scopes.get(name)
        if scope is None or scope[0] not in out.forward_ms:
            out.outside_ms += ms
        else:
            side = out.backward_ms if scope[1] else out.forward_ms
            side[scope[0]] += ms
    return out


def profile_program(program: Any, args: Sequence[Any], iterations: int, folder: Path,
                    layers: Sequence[str], perfetto: bool = False) -> LayerProfile:  # fmt: skip
    """Trace ``iterations`` runs of the compiled ``program`` on ``args`` into ``folder`` and
    attribute its ops to ``layers`` (the names of their ``jax.named_scope``). Run it warm
    (``time_net`` profiles after its timing loop), so no first-run cost is in the profile."""
    hlo = program.as_text()
    module = re.match(r"HloModule\s+([^\s,]+)", hlo)
    before = set(folder.glob("plugins/profile/*/*.xplane.pb"))
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    with jax.profiler.trace(folder, create_perfetto_trace=perfetto, profiler_options=options):
        start = time.perf_counter()
        for _ in range(iterations):
            jax.block_until_ready(program(*args))
        wall = (time.perf_counter() - start) / iterations * 1e3
    written = sorted(set(folder.glob("plugins/profile/*/*.xplane.pb")) - before)
    if not written or module is None:
        raise CaffeError(f"the profiler wrote no trace into {folder}")
    times, span, runs, threads = op_times(written[-1], module.group(1))
    scopes, entry = instruction_scopes(hlo, layers)
    out = attribute(times, scopes, entry, runs, layers)
    out.span_ms, out.threads, out.trace = span * 1e-6 / max(runs, 1), threads, written[-1]
    out.wall_ms = wall
    return out
