"""Argument types shared by the verbs: Caffe's tool reads its numeric flags as gflags int32."""

from __future__ import annotations

import argparse

INT32 = (-(2**31), 2**31 - 1)


def int32(text: str) -> int:
    """An integer flag as Caffe's gflags ``int32`` reads it: out of range is an error (gflags
    prints "failed validation"), not a number wrapped or grown past what Caffe's ints hold."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer: {text[:40]!r}") from None
    if not INT32[0] <= value <= INT32[1]:
        raise argparse.ArgumentTypeError(f"{text[:40]} is out of range ({INT32[0]}..{INT32[1]})")
    return value
