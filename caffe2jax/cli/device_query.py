"""`caffe2jax device_query`: the devices JAX sees, like `caffe device_query`."""

from __future__ import annotations

import argparse

import jax

from caffe2jax import __version__
from caffe2jax.cli.args import Subparsers


def add(sub: Subparsers) -> None:
    p = sub.add_parser("device_query", help="list the devices JAX can run on")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(f"caffe2jax {__version__}, jax {jax.__version__}, backend {jax.default_backend()}")
    for device in jax.devices():
        print(f"Device id: {device.id}")
        print(f"  Kind: {device.device_kind}")
        print(f"  Platform: {device.platform}")
        stats = getattr(device, "memory_stats", lambda: None)()
        if stats and "bytes_limit" in stats:
            print(f"  Memory: {stats['bytes_limit'] / 2**30:.1f} GiB")
    return 0
