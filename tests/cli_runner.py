"""Running the `caffe2jax` command line in a subprocess, as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m caffe2jax ARGS``: exit code, stdout and stderr as text."""
    return subprocess.run(
        [sys.executable, "-m", "caffe2jax", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )
