"""scripts/make_boxes.py (the synthetic detection set) as a module for tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_make_boxes():
    """scripts/make_boxes.py as a module (scripts/ is not a package)."""
    if "make_boxes" in sys.modules:
        return sys.modules["make_boxes"]
    spec = importlib.util.spec_from_file_location("make_boxes", ROOT / "scripts" / "make_boxes.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_boxes"] = module
    spec.loader.exec_module(module)
    return module
