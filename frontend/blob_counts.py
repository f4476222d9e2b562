"""How many bottoms and tops each Caffe layer type accepts (Layer::CheckBlobCounts facts).

Each entry is ``(min_bottoms, max_bottoms, min_tops, max_tops)``; ``None`` means unbounded.
Types whose counts depend on their parameters (RNN, LSTM, Python) are checked by their lowering.
"""

from __future__ import annotations

_ONE_TO_ONE = (1, 1, 1, 1)
_DATA_ONE_OR_TWO = (0, 0, 1, 2)
_LOSS = (2, 2, 1, 1)

BLOB_COUNTS: dict[str, tuple[int, int | None, int, int | None]] = {
    **{
        t: _ONE_TO_ONE
        for t in (
            "AbsVal BNLL Clip Dropout ELU Exp Log Power PReLU ReLU Sigmoid Swish TanH Threshold "
            "ArgMax BatchNorm Embed Flatten Im2col InnerProduct LRN MVN Reduction Reshape "
            "Softmax SPP Tile"
        ).split()
    },
    "Accuracy": (2, 2, 1, 2),
    "BatchReindex": (2, 2, 1, 1),
    "Bias": (1, 2, 1, 1),
    "Concat": (1, None, 1, 1),
    "ContrastiveLoss": (3, 3, 1, 1),
    "Convolution": (1, None, 1, None),
    "Deconvolution": (1, None, 1, None),
    "Crop": (2, 2, 1, 1),
    "Data": _DATA_ONE_OR_TWO,
    "DummyData": (0, 0, 1, None),
    "Eltwise": (2, None, 1, 1),
    "EuclideanLoss": _LOSS,
    "Filter": (2, None, 1, None),
    "HDF5Data": (0, 0, 1, None),
    "HDF5Output": (2, 2, 0, 0),
    "HingeLoss": _LOSS,
    "ImageData": (0, 0, 2, 2),
    "InfogainLoss": (2, 3, 1, 2),
    "Input": (0, 0, 1, None),
    "LSTMUnit": (3, 3, 2, 2),
    "MemoryData": (0, 0, 2, 2),
    "MemoryLoss": (1, 2, 1, 1),
    "MultinomialLogisticLoss": _LOSS,
    "Parameter": (0, 0, 1, 1),
    "Pooling": (1, 1, 1, 2),
    "Scale": (1, 2, 1, 1),
    "SigmoidCrossEntropyLoss": _LOSS,
    "Silence": (1, None, 0, 0),
    "Slice": (1, 1, 1, None),
    "SoftmaxWithLoss": (2, 2, 1, 2),
    "Split": (1, 1, 1, None),
    "WindowData": (0, 0, 2, 2),
}

# Convolution and Deconvolution map bottom i to top i (EqualNumBottomTopBlobs).
EQUAL_BOTTOM_TOP = frozenset({"Convolution", "Deconvolution"})


def _range(lo: int, hi: int | None) -> str:
    if hi == lo:
        return f"exactly {lo}"
    return f"at least {lo}" if hi is None else f"{lo} to {hi}"


def check_blob_counts(layer_type: str, n_bottoms: int, n_tops: int) -> str | None:
    """None when the counts are acceptable, else a description of what the type accepts."""
    if layer_type not in BLOB_COUNTS:
        return None
    lo_b, hi_b, lo_t, hi_t = BLOB_COUNTS[layer_type]
    if n_bottoms < lo_b or (hi_b is not None and n_bottoms > hi_b):
        return f"takes {_range(lo_b, hi_b)} bottom blob(s), got {n_bottoms}"
    if n_tops < lo_t or (hi_t is not None and n_tops > hi_t):
        return f"produces {_range(lo_t, hi_t)} top blob(s), got {n_tops}"
    if layer_type in EQUAL_BOTTOM_TOP and n_bottoms != n_tops:
        return f"needs as many tops as bottoms, got {n_bottoms} bottom(s) and {n_tops} top(s)"
    return None
