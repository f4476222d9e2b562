"""The `caffe2jax` command line: ``main`` (main.py) and one module per verb, each exposing
``add(subparsers)``; ``args`` holds every flag the verbs share. The work is the runtime's
(the `time` verb's measurements: :mod:`caffe2jax.runtime.tools.timing`; Caffe's log lines:
:mod:`caffe2jax.logs`)."""

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
