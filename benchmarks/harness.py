"""Shared timing harness for the side-by-side tables: interleaved blocks, medians, JSON + markdown.

Each case pairs caffe2jax with a peer. After one warm-up call each (compile time recorded apart),
the two are timed in alternating blocks, so a load change on a shared machine hits both alike;
the figure reported is the median block's time per call.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

Runner = Callable[[], object]


def block_until_ready(value: object) -> None:
    """Wait for JAX arrays (any pytree); torch and NumPy results are ready already."""
    import jax

    jax.block_until_ready(value)


@dataclass
class Row:
    """One table row: the case, both sides' medians (ms per call), compile time, the blocks."""

    case: str
    peer: str
    ours_ms: float = 0.0
    peer_ms: float = 0.0
    compile_s: float = 0.0
    ours_blocks: list[float] = field(default_factory=list)
    peer_blocks: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.ours_ms / self.peer_ms if self.peer_ms else float("nan")


def time_block(run: Runner, calls: int) -> float:
    """Milliseconds per call over ``calls`` back-to-back calls (results waited for at the end)."""
    start = time.perf_counter()
    out = None
    for _ in range(calls):
        out = run()
    block_until_ready(out)
    return (time.perf_counter() - start) / calls * 1e3


# Set by --ours-only (the XLA flag sweep): the peer is neither built nor timed.
OURS_ONLY = False


def measure(row: Row, ours: Runner, peer: Callable[[], Runner], calls: int, blocks: int) -> Row:
    """Warm both up (ours' first call is its compile), then ``blocks`` alternating blocks.
    ``peer`` builds the peer's runner (skipped when :data:`OURS_ONLY`)."""
    start = time.perf_counter()
    block_until_ready(ours())
    row.compile_s = time.perf_counter() - start
    time_block(ours, 1)
    theirs = None if OURS_ONLY else peer()
    if theirs is not None:
        time_block(theirs, 1)
    for _ in range(blocks):
        row.ours_blocks.append(time_block(ours, calls))
        if theirs is not None:
            row.peer_blocks.append(time_block(theirs, calls))
    row.ours_ms = statistics.median(row.ours_blocks)
    row.peer_ms = statistics.median(row.peer_blocks) if row.peer_blocks else 0.0
    return row


def result_line(case: str, ours_ms: float, peer_ms: float, peer: str = "torch-eager") -> str:
    """The one machine-readable line a fork benchmark prints last (issue 39): both medians from
    the same run and their ratio (caffe2jax's time ÷ the peer's), with the load average."""
    ratio = ours_ms / peer_ms if peer_ms else float("nan")
    fields = {"case": case, "caffe2jax_ms": round(ours_ms, 2), "peer": peer,
              "peer_ms": round(peer_ms, 2), "ratio": round(ratio, 3),
              "load_avg": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
    return "RESULT " + json.dumps(fields)


def machine() -> dict:
    import jax

    info = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "python": sys.version.split()[0],
        "jax": jax.__version__,
        "device": str(jax.devices()[0].device_kind),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    for name in ("torch", "cv2"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(ln.split(":", 1)[1].strip() for ln in f if "model name" in ln)
    except (OSError, StopIteration):
        pass
    return info


def markdown(title: str, rows: list[Row], info: dict) -> str:
    lines = [
        f"### {title}",
        "",
        f"{info['cpu']}, {info['cores']} cores, load average at start "
        f"{', '.join(f'{x:.2f}' for x in info['load_avg'])}; jax {info['jax']}, "
        f"torch {info.get('torch')}, OpenCV {info.get('cv2')}",
        "",
        "| case | caffe2jax | peer | ratio | compile |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ours = f"{r.ours_ms:.2f} ms"
        peer = f"{r.peer}: {r.peer_ms:.2f} ms" if r.peer_ms else f"{r.peer}: not measured"
        ratio = f"{r.ratio:.2f}×" if r.peer_ms else "—"
        note = f" ({r.note})" if r.note else ""
        lines.append(f"| {r.case}{note} | {ours} | {peer} | {ratio} | {r.compile_s:.1f} s |")
    return "\n".join(lines) + "\n"


def write(stem: str, title: str, rows: list[Row], info: dict, command: str,
          out: Path | None = None, text: str | None = None) -> Path:  # fmt: skip
    """Print the markdown table (``text``, else the generic one); write
    ``results/<stem>-<UTC time>.json`` and ``.md`` (or ``out`` + ``.json``/``.md``)."""
    text = (text or markdown(title, rows, info)) + f"\nReproduce: `{command}`\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    when = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = out or RESULTS / f"{stem}-{when}"
    payload = {"title": title, "machine": info, "command": command, "when": when,
               "rows": [asdict(r) | {"ratio": r.ratio} for r in rows]}  # fmt: skip
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
    out.with_suffix(".md").write_text(text)
    print(f"wrote {out}.json and .md")
    return out
