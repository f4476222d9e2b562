"""Access to the real-Caffe oracle in ../shared/caffe (relative to the project root).

The oracle is required: a missing directory is a test failure, never a skip.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = (ROOT / ".." / "shared" / "caffe").resolve()
GOLDEN = SHARED / "golden"
MODELS = SHARED / "models"
TEST_DATA = SHARED / "test_data"


def require(path: Path) -> Path:
    """Return `path`, failing (not skipping) when the oracle is not checked out beside us."""
    if not path.exists():
        raise FileNotFoundError(
            f"golden data missing: {path} (expected ../shared/caffe beside the project root)"
        )
    return path


def load_npz(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """Load a golden npz: (arrays, meta). `meta` is the decoded JSON of the `meta` entry."""
    with np.load(require(path), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays.pop("meta").item())
    return arrays, meta
