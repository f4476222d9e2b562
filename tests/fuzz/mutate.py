"""Seeded mutations of Caffe files: prototxt text (token-aware) and binary bytes.

Each mutation is drawn from a ``random.Random`` so that a case is reproduced from its seed
alone. Values are chosen to reach the edges users hit: extreme and negative dims, ``-0``,
NaN/inf, huge repeat counts, control bytes, truncation, duplicated blocks.
"""

from __future__ import annotations

import random
import re
import struct

INTERESTING_NUMBERS = [
    "0", "-0", "1", "-1", "2", "3", "7", "-7", "255", "256", "65535", "2147483647",
    "-2147483648", "2147483648", "4294967296", "9223372036854775807", "99999999999999999999",
    "1000000000", "100000000", "1e9", "1e38", "1e39", "-1e39", "nan", "inf", "-inf", "0.0",
    "1e-45", "0x10", "1.5", "-0.5", "65536", "4096", "10000",
]  # fmt: skip
INTERESTING_WORDS = [
    "Convolution", "Pooling", "InnerProduct", "ReLU", "Softmax", "SoftmaxWithLoss", "Input",
    "Data", "HDF5Data", "MemoryData", "Concat", "Slice", "Eltwise", "Reshape", "Flatten",
    "BatchNorm", "Scale", "Deconvolution", "LRN", "Dropout", "Split", "Crop", "Embed",
    "Python", "Accuracy", "EuclideanLoss", "Bias", "Tile", "ArgMax", "SPP", "LSTM", "RNN",
    "AVE", "MAX", "STOCHASTIC", "TRAIN", "TEST", "LMDB", "LEVELDB", "SGD", "Adam", "HDF5",
    "layer", "layers", "bottom", "top", "name", "type", "param", "dim", "shape", "num_output",
    "kernel_size", "pad", "stride", "group", "axis", "include", "exclude", "phase", "lr_mult",
    "loss_weight", "propagate_down", "input", "input_dim", "input_shape", "weight_filler",
    "bias_term", "pool", "global_pooling", "operation", "coeff", "slice_point", "dilation",
    "base_lr", "max_iter", "lr_policy", "gamma", "stepsize", "stepvalue", "momentum",
    "weight_decay", "iter_size", "net", "test_iter", "test_interval", "snapshot",
    "snapshot_prefix", "solver_mode", "delta", "momentum2", "power", "batch_size",
]  # fmt: skip
INTERESTING_INTS = [
    0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
    0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 1 << 40, 1000000000,
]  # fmt: skip

_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|[A-Za-z_][\w.]*|[-+]?[\d.][\w.+-]*|\s+|.', re.S)


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def _is_number(tok: str) -> bool:
    return bool(re.fullmatch(r"[-+]?[\d.][\w.+-]*", tok))


def _is_word(tok: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_][\w.]*", tok))


def _pick(rng: random.Random, tokens: list[str], pred) -> int | None:
    indices = [i for i, t in enumerate(tokens) if pred(t)]
    return rng.choice(indices) if indices else None


def _text_op(rng: random.Random, tokens: list[str], donors: list[str]) -> list[str]:
    op = rng.randrange(11)
    n = len(tokens)
    if not n:
        return ["layer { }"]
    if op == 0:  # a number → an extreme value
        i = _pick(rng, tokens, _is_number)
        if i is not None:
            tokens[i] = rng.choice(INTERESTING_NUMBERS)
    elif op == 1:  # a word → another Caffe word
        i = _pick(rng, tokens, _is_word)
        if i is not None:
            tokens[i] = rng.choice(INTERESTING_WORDS)
    elif op == 2:  # a string → a type name, empty, long, or with odd characters
        i = _pick(rng, tokens, lambda t: t.startswith('"'))
        if i is not None:
            choice = rng.randrange(5)
            inner = [
                rng.choice(INTERESTING_WORDS),
                "",
                "x" * rng.choice([300, 5000, 70000]),
                "../" * 5 + "etc/passwd",
                "a\\x00b/c\\377",
            ][choice]
            tokens[i] = f'"{inner}"'
    elif op == 3:  # delete a span
        i = rng.randrange(n)
        del tokens[i : i + rng.choice([1, 1, 2, 5, 20])]
    elif op == 4:  # duplicate a span
        i = rng.randrange(n)
        span = tokens[i : i + rng.choice([1, 3, 10, 40, 200])]
        j = rng.randrange(n + 1)
        tokens[j:j] = span * rng.choice([1, 1, 2, 50])
    elif op == 5:  # swap two tokens
        i, j = rng.randrange(n), rng.randrange(n)
        tokens[i], tokens[j] = tokens[j], tokens[i]
    elif op == 6:  # a raw byte (control characters included)
        i = rng.randrange(n + 1)
        tokens.insert(i, chr(rng.choice([0, 1, 7, 8, 0x0B, 0x0C, 0x1B, 0x7F, 0x85, 0xA0, 0xFFFD])))
    elif op == 7:  # truncate
        del tokens[rng.randrange(n) :]
    elif op == 8:  # a line (token run) from another seed
        if donors:
            donor = _tokens(rng.choice(donors))
            i = rng.randrange(len(donor) or 1)
            j = rng.randrange(n + 1)
            tokens[j:j] = donor[i : i + rng.choice([5, 20, 60])]
    elif op == 9:  # unbalanced braces / punctuation
        i = rng.randrange(n + 1)
        tokens.insert(i, rng.choice(["{", "}", ":", "[", "]", "<", ",", ";", "#", "'"]))
    else:  # a whole field with an extreme value
        i = rng.randrange(n + 1)
        word = rng.choice(INTERESTING_WORDS)
        tokens[i:i] = [f" {word}: {rng.choice(INTERESTING_NUMBERS)} "]
    return tokens


def _semantic_op(rng: random.Random, tokens: list[str]) -> list[str]:
    """A change that keeps the text well-formed, to reach past the parser: a value replaced,
    a line deleted or duplicated."""
    op = rng.choice("nnnnsseld")
    if op == "n":
        i = _pick(rng, tokens, _is_number)
        if i is not None:
            tokens[i] = rng.choice(INTERESTING_NUMBERS)
    elif op == "s":
        i = _pick(rng, tokens, lambda t: t.startswith('"'))
        strings = [t for t in tokens if t.startswith('"')]
        if i is not None:
            tokens[i] = rng.choice([f'"{rng.choice(INTERESTING_WORDS)}"', '""', *strings])
    elif op == "e":
        i = _pick(rng, tokens, lambda t: _is_word(t) and t.isupper())
        if i is not None:
            tokens[i] = rng.choice([w for w in INTERESTING_WORDS if w.isupper()])
    else:
        lines = "".join(tokens).split("\n")
        i = rng.randrange(len(lines))
        if op == "l":
            del lines[i]
        else:
            lines.insert(rng.randrange(len(lines) + 1), lines[i])
        tokens = _tokens("\n".join(lines))
    return tokens


def mutate_text(rng: random.Random, text: str, donors: list[str] = ()) -> str:
    """``text`` after 1–4 mutations: well-formed value changes (60 %) or raw token edits."""
    tokens = _tokens(text)
    semantic = rng.random() < 0.6
    for _ in range(rng.choice([1, 1, 2, 3, 4])):
        tokens = _semantic_op(rng, tokens) if semantic else _text_op(rng, tokens, list(donors))
    return "".join(tokens)


def _byte_op(rng: random.Random, data: bytearray) -> bytearray:
    n = len(data)
    if not n:
        return bytearray(rng.randbytes(rng.randrange(1, 64)))
    op = rng.randrange(9)
    i = rng.randrange(n)
    if op == 0:  # bit flip
        data[i] ^= 1 << rng.randrange(8)
    elif op == 1:  # an interesting byte
        data[i] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, 0x0A, 0x12, 0x1A])
    elif op == 2:  # an interesting little-endian int (4 or 8 bytes)
        value = rng.choice(INTERESTING_INTS)
        size = rng.choice([4, 8])
        data[i : i + size] = struct.pack("<Q", value & 0xFFFFFFFFFFFFFFFF)[:size]
    elif op == 3:  # insert random bytes
        data[i:i] = rng.randbytes(rng.choice([1, 2, 8, 64]))
    elif op == 4:  # delete a span
        del data[i : i + rng.choice([1, 4, 16, 256])]
    elif op == 5:  # duplicate a span
        span = data[i : i + rng.choice([4, 32, 512])]
        j = rng.randrange(n + 1)
        data[j:j] = span
    elif op == 6:  # truncate
        del data[i:]
    elif op == 7:  # a maximal varint (protobuf lengths and dims)
        data[i:i] = b"\xff" * 9 + b"\x01"
    else:  # random overwrite
        size = rng.choice([1, 4, 16])
        data[i : i + size] = rng.randbytes(size)
    return data


def mutate_bytes(rng: random.Random, data: bytes, ops: int | None = None) -> bytes:
    """``data`` after 1–4 byte-level mutations (or exactly ``ops``)."""
    out = bytearray(data)
    for _ in range(ops or rng.choice([1, 1, 2, 3, 4])):
        out = _byte_op(rng, out)
    return bytes(out)
