"""The `caffe2jax` command line: ``main`` (main.py) and one module per verb, each exposing
``add(subparsers)``; ``timing`` holds the `time` verb's measurements, ``logs`` Caffe's log lines."""

COMMANDS: list[str] = [
    "absorb_bn",
    "compare",
    "compute_bn_stats",
    "compute_image_mean",
    "convert_annoset",
    "convert_imageset",
    "convert_weights",
    "detect",
    "device_query",
    "draw",
    "export",
    "plot",
    "rl",
    "segment",
    "summary",
    "test",
    "time",
    "train",
    "upgrade",
]
