"""tests/conftest.py's ``heavy`` mark, as README states it: the default run deselects the
tests marked heavy, ``-m heavy`` collects them."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = "tests/cli/test_train_crnn.py"  # one test, marked heavy


def _collect(*args: str) -> str:
    command = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *args, HEAVY]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return run.stdout


def test_heavy_tests_are_deselected_by_default_and_collected_with_m_heavy():
    default = _collect()
    assert "1 deselected" in default and "test_train_crnn.py::" not in default
    assert "tests/cli/test_train_crnn.py::" in _collect("-m", "heavy")
