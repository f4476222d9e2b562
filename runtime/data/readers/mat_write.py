"""DeepLab's ``MatWrite`` layer (DeepLab v1/v2 src/caffe/layers/mat_write_layer.cpp): a
test-time output writer, run by the runtime after each forward like HDF5Output
(:class:`caffe2jax.runtime.data.feeding.Sinks`).

What it reproduces: a counter ``iter`` of forwards, starting at 0. On every forward with
``iter % period == 0`` each bottom ``i`` is written to
``prefix + name + "_blob_" + i + ".mat"``, where ``name`` is line ``iter`` of
``mat_write_param.source`` (its first whitespace-separated word, less ``strip`` characters
at its end: the image ids of DeepLab's test lists) or ``"iter_" + iter`` without a source; a
forward past the end of the list is an error, as the fork's CHECK. The file is a MATLAB v5
MAT-file (Caffe's ``Blob::ToMat`` through matio's ``Mat_Create``, uncompressed) holding one
variable ``data``: single precision of MATLAB size ``[W H C N]`` (the blob's legacy 4-D shape
reversed: the same memory as Caffe's row-major N×C×H×W), so ``data(w, h, c, n)`` is
``blob[n, c, h, w]``. Written with ``scipy.io.savemat``; each file appears whole (written
beside and renamed). A relative ``prefix`` is under ``out_dir`` when one is given, else the
working directory, as in Caffe; ``source`` is read from the working directory, as in Caffe.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import DataError
from caffe2jax.runtime.data.readers import reader
from caffe2jax.runtime.data.readers.hdf5_data import legacy_shape
from caffe2jax.runtime.formats.atomic import atomic_path


def image_ids(source: str, strip: int, where: str) -> list[str]:
    """The names MatWrite gives its files: the first word of each line of ``source``, less
    ``strip`` characters at its end (DeepLab's LayerSetUp)."""
    if strip < 0:
        raise DataError(f"{where}: mat_write_param.strip cannot be negative ({strip})")
    try:
        lines = Path(source).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{where}: cannot read mat_write_param.source {source} ({err})") from None
    names = []
    for number, line in enumerate(lines, 1):
        word = line.split()[0] if line.split() else ""
        if len(word) <= strip:
            raise DataError(f"{source}:{number}: {word!r} is too short to strip {strip} characters")
        names.append(word[: len(word) - strip])
    return names


@reader("MatWrite")
class MatWriteSink:
    """Writes the bottoms of a ``MatWrite`` layer as .mat files after each forward."""

    def __init__(self, layer: caffe_pb2.LayerParameter, *, out_dir: Path | None = None) -> None:
        p = layer.mat_write_param
        self.where = f"layer {layer.name!r} (MatWrite)"
        if not p.prefix:
            raise DataError(f"{self.where}: mat_write_param.prefix is required")
        if p.period <= 0:
            raise DataError(f"{self.where}: mat_write_param.period must be positive ({p.period})")
        self.prefix = p.prefix if out_dir is None else os.path.join(out_dir, p.prefix)
        self.period = p.period
        self.names = image_ids(p.source, p.strip, self.where) if p.HasField("source") else None
        self.iter = 0

    def path(self, index: int) -> Path:
        """The file of bottom ``index`` at the current forward."""
        if self.names is None:
            name = f"iter_{self.iter}"
        elif self.iter < len(self.names):
            name = self.names[self.iter]
        else:
            raise DataError(f"{self.where}: forward {self.iter + 1} but the source lists only "
                            f"{len(self.names)} images")  # fmt: skip
        return Path(f"{self.prefix}{name}_blob_{index}.mat")

    def write(self, bottoms: Sequence[np.ndarray]) -> None:
        """One forward: every bottom written when ``iter`` is a multiple of ``period``."""
        from scipy.io import savemat

        if self.iter % self.period == 0:
            for i, blob in enumerate(bottoms):
                path = self.path(i)
                array = np.asarray(blob, np.float32)
                array = array.reshape(legacy_shape(array.shape, str(path))).transpose(3, 2, 1, 0)
                if not path.parent.is_dir():
                    raise DataError(f"{self.where}: folder {path.parent} of {path} does not exist")
                with atomic_path(path) as tmp, open(tmp, "wb") as handle:
                    savemat(handle, {"data": array}, format="5", do_compression=False)
        self.iter += 1

    def close(self) -> None:
        """Nothing stays open between forwards."""
