"""pycaffe's global switches: ``set_mode_cpu``, ``set_mode_gpu``, ``set_device``,
``set_random_seed``. Devices are JAX's; the seed is the default for nets built afterwards."""

from __future__ import annotations

import logging

import jax

log = logging.getLogger("caffe2jax")
_seed = 0


def set_mode_cpu() -> None:
    """Run on the CPU (JAX's default device becomes the first CPU device)."""
    jax.config.update("jax_default_device", jax.devices("cpu")[0])


def set_mode_gpu() -> None:
    """Run on the first GPU; without one, stay on the CPU and say so."""
    try:
        jax.config.update("jax_default_device", jax.devices("gpu")[0])
    except RuntimeError:
        log.warning("set_mode_gpu: no GPU is visible to JAX; running on the CPU")


def set_device(device_id: int) -> None:
    """Use GPU ``device_id`` (or the CPU when JAX sees no GPU)."""
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        log.warning("set_device: no GPU is visible to JAX; running on the CPU")
        return
    if not 0 <= device_id < len(gpus):
        raise ValueError(f"set_device: no GPU {device_id} (JAX sees {len(gpus)})")
    jax.config.update("jax_default_device", gpus[device_id])


def set_random_seed(seed: int) -> None:
    """The seed for fillers and random layers of nets created from now on."""
    global _seed
    _seed = int(seed)


def random_seed() -> int:
    return _seed
