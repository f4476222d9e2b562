"""Subcommands of the `caffe2jax` CLI: one module each, exposing ``add(subparsers)``."""

COMMANDS: list[str] = [
    "summary",
    "upgrade",
]
