#!/usr/bin/env python
"""Generate frontend/caffe_pb2.py from frontend/caffe.proto with grpc_tools' bundled protoc.

    python scripts/gen_proto.py           # rewrite frontend/caffe_pb2.py
    python scripts/gen_proto.py --check   # exit 1 if the committed file is stale

The protoc in grpcio-tools 1.85.1 (libprotoc 35.1) is pinned in the dev extras, so a
regeneration is reproducible byte for byte. protoc always runs from the repository root with
relative paths (`-I frontend --python_out=frontend frontend/caffe.proto`), which keeps the
descriptor's file name "caffe.proto" and no machine-specific path ends up in the output.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = "frontend"
PROTO_NAME = "caffe.proto"
OUTPUT_NAME = "caffe_pb2.py"


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def generate(out_dir: Path, root: Path = ROOT) -> Path:
    """Run protoc on `root`/frontend/caffe.proto, writing caffe_pb2.py into `out_dir`."""
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit(
            "grpcio-tools is needed to generate caffe_pb2.py (pip install 'grpcio-tools==1.85.1')"
        ) from exc

    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    # protoc resolves -I and the input file relative to the working directory.
    with _cwd(root):
        args = [
            "protoc",
            f"-I{PROTO_DIR}",
            f"--python_out={out_dir}",
            f"{PROTO_DIR}/{PROTO_NAME}",
        ]
        status = protoc.main(args)
    if status != 0:
        raise SystemExit(f"protoc failed with status {status}")
    produced = out_dir / OUTPUT_NAME
    if not produced.is_file():
        raise SystemExit(f"protoc did not write {produced}")
    return produced


def check(root: Path = ROOT) -> bool:
    """True when the committed caffe_pb2.py equals a fresh generation, byte for byte."""
    committed = root / PROTO_DIR / OUTPUT_NAME
    with tempfile.TemporaryDirectory(prefix="caffe2jax-proto-") as tmp:
        fresh = generate(Path(tmp), root).read_bytes()
    return committed.is_file() and committed.read_bytes() == fresh


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary directory and fail if frontend/caffe_pb2.py differs",
    )
    args = parser.parse_args(argv)

    if args.check:
        if check():
            print(f"{PROTO_DIR}/{OUTPUT_NAME} is up to date")
            return 0
        print(
            f"{PROTO_DIR}/{OUTPUT_NAME} is stale or missing: run python scripts/gen_proto.py",
            file=sys.stderr,
        )
        return 1

    with tempfile.TemporaryDirectory(prefix="caffe2jax-proto-") as tmp:
        produced = generate(Path(tmp))
        target = ROOT / PROTO_DIR / OUTPUT_NAME
        shutil.copyfile(produced, target)
    print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
