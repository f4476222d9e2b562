"""Subcommands of the `caffe2jax` CLI: one module each, exposing ``add(subparsers)``."""

COMMANDS: list[str] = [
    "compute_image_mean",
    "convert_imageset",
    "convert_weights",
    "device_query",
    "draw",
    "export",
    "plot",
    "rl",
    "summary",
    "test",
    "time",
    "train",
    "upgrade",
]
