"""The wheel's contents come from pyproject.toml (`pip wheel .`; .ci/run builds one and installs
it beside OpenCV 5): every package folder is listed (a missing one would install a wheel that
fails at import), the licence file is shipped, the metadata names the platforms it runs on."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "pyproject.toml").read_text()
FOLDERS = {"caffe2jax": "caffe2jax", "frontend": "caffe2jax.frontend",
           "lowering": "caffe2jax.lowering", "runtime": "caffe2jax.runtime"}  # fmt: skip


def listed_packages() -> set[str]:
    block = re.search(r"^packages = \[(.*?)^\]", TEXT, re.S | re.M).group(1)
    return set(re.findall(r'"([\w.]+)"', block))


def test_every_package_folder_is_in_the_wheel():
    found = set()
    for folder, package in FOLDERS.items():
        for init in (ROOT / folder).rglob("*.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *parts)))
    assert found - listed_packages() == set()


def test_licence_and_metadata():
    assert re.search(r'^license-files = \["LICENSE"\]', TEXT, re.M)
    assert (ROOT / "LICENSE").read_text().startswith("BSD 2-Clause License")
    systems = ("Microsoft :: Windows", "MacOS", "POSIX :: Linux")
    for classifier in [f"Operating System :: {s}" for s in systems]:
        assert f'"{classifier}"' in TEXT
