"""What a prototxt's text says around an error: the layer a position lies in (its name and
type, read from the text when protobuf stopped parsing), and whether an unknown field name is
a known one misspelt.

Protobuf's text parser stops at the first unknown field with only a position; these helpers
let the parse error name the layer, as every other error about a layer does, and keep its
"did you mean" to true misspellings (``convolution_parm`` → ``convolution_param``), never a
different field that happens to look alike (``transpose_param`` is not ``transform_param``,
``normalize_param`` not ``norm_param``, ``center_loss_param`` not ``ctc_loss_param``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_OPEN = re.compile(r"\b(layers?)\s*:?\s*$")
_FIELD = re.compile(r"""\b(name|type)\s*:\s*("[^"\n]*"|'[^'\n]*'|[A-Za-z_]\w*)""")


def _skip(text: str, i: int) -> int:
    """The index after a comment or a quoted string starting at ``i`` (else ``i``)."""
    if text[i] == "#":
        end = text.find("\n", i)
        return len(text) if end < 0 else end
    if text[i] in "\"'":
        j = i + 1
        while j < len(text) and text[j] != text[i] and text[j] != "\n":
            j += 2 if text[j] == "\\" else 1
        return j + 1
    return i


def layer_blocks(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of each top-level ``layer { … }`` / ``layers { … }`` block (an
    unclosed last block ends at the end of the text)."""
    blocks, depth, start, i = [], 0, None, 0
    while i < len(text):
        j = _skip(text, i)
        if j != i:
            i = j
            continue
        if text[i] == "{":
            if depth == 0 and _OPEN.search(text[max(0, i - 40) : i]):
                start = i
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0 and start is not None:
                blocks.append((start, i))
                start = None
        i += 1
    if start is not None:
        blocks.append((start, len(text)))
    return blocks


def _top_level(body: str) -> str:
    """``body`` with every nested block, comment and string blanked out except the strings
    at its own level (so ``name``/``type`` of a param or a filler are not read)."""
    out, depth, i = [], 0, 0
    while i < len(body):
        j = _skip(body, i)
        if j != i:
            out.append(body[i:j] if depth == 0 and body[i] != "#" else " " * (j - i))
            i = j
            continue
        depth += body[i] == "{"
        out.append(body[i] if depth == 0 else " ")
        depth -= body[i] == "}"
        i += 1
    return "".join(out)


def enclosing_layer(text: str, line: int, column: int) -> tuple[str, str] | None:
    """(name, type) of the top-level layer whose block holds ``line``:``column`` (1-based),
    as the text writes them ("" where it gives none); None outside every layer."""
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        return None
    offset = sum(len(x) + 1 for x in lines[: line - 1]) + max(column - 1, 0)
    for start, end in layer_blocks(text):
        if start <= offset <= end:
            fields = dict(m.groups() for m in _FIELD.finditer(_top_level(text[start + 1 : end])))
            return fields.get("name", "").strip("\"'"), fields.get("type", "").strip("\"'")
    return None


def _distance(a: str, b: str) -> int:
    """Edit distance counting a swap of two neighbouring letters as one edit (optimal string
    alignment), the typo a hand makes."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(
                d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])
            )
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def is_misspelling(name: str, candidate: str) -> bool:
    """Whether ``name`` is ``candidate`` misspelt: the same letters in another case, or the
    same ``_``-separated words, each within a typo or two of its counterpart (one edit per
    four letters, at least one) and the whole within one edit per six letters."""
    if name == candidate:
        return False
    if name.lower() == candidate.lower():
        return True
    words, target = name.split("_"), candidate.split("_")
    if len(words) != len(target):
        return False
    edits = 0
    for a, b in zip(words, target):
        d = _distance(a, b)
        if d > max(1, min(len(a), len(b)) // 4):
            return False
        edits += d
    return edits <= max(1, len(candidate) // 6)


def misspelt(name: str, known: Iterable[str]) -> str | None:
    """The known field ``name`` misspells (the closest, then the first), None if none."""
    found = [k for k in known if is_misspelling(name, k)]
    return min(found, key=lambda k: _distance(name, k)) if found else None


def _snake(camel: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", camel).lower()


def misspelt_type(name: str, known: Iterable[str]) -> str | None:
    """The known layer type ``name`` misspells, its CamelCase words compared as a field's
    (``Convolutoin`` → ``Convolution``; ``CenterLoss`` is not ``CtcLoss``)."""
    if any(name.lower() == k.lower() and name != k for k in known):
        return next(k for k in known if name.lower() == k.lower())
    by_snake = {_snake(k): k for k in known}
    found = misspelt(_snake(name), by_snake)
    return by_snake[found] if found else None
