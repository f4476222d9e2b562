"""Host-side data pipeline: Caffe's data layers (:mod:`.readers`, one per type), their records
and databases (:mod:`.records`), decoding and DataTransformer (:mod:`.transform`), and the
feeding, prefetching and worker threads around them. Caffe's dataset tools are
:mod:`caffe2jax.runtime.tools`."""

from caffe2jax.runtime.data.base import ItemSource
from caffe2jax.runtime.data.prefetch import Prefetcher, prefetch_depth
from caffe2jax.runtime.data.readers.hdf5_data import HDF5DataSource, HDF5OutputSink, make_sink
from caffe2jax.runtime.data.records.datum import (
    array_to_blobproto,
    array_to_datum,
    blobproto_to_array,
    datum_to_array,
    encoded_datum,
    parse_datum,
    read_blobproto,
    write_blobproto,
)
from caffe2jax.runtime.data.records.db import Cursor, Database, Writer, open_db
from caffe2jax.runtime.data.sources import (
    DataLayerSource,
    DataSource,
    ImageDataSource,
    make_source,
)
from caffe2jax.runtime.data.transform.image import (
    decode_image,
    encode_image,
    read_image,
    resize,
)
from caffe2jax.runtime.data.transform.transformer import DataTransformer
from caffe2jax.runtime.data.workers import available_cores, default_workers, set_default_workers

__all__ = [
    "Cursor",
    "DataLayerSource",
    "DataSource",
    "DataTransformer",
    "Database",
    "HDF5DataSource",
    "HDF5OutputSink",
    "ImageDataSource",
    "ItemSource",
    "Prefetcher",
    "Writer",
    "array_to_blobproto",
    "available_cores",
    "array_to_datum",
    "blobproto_to_array",
    "datum_to_array",
    "default_workers",
    "decode_image",
    "encode_image",
    "encoded_datum",
    "make_sink",
    "make_source",
    "open_db",
    "parse_datum",
    "prefetch_depth",
    "read_blobproto",
    "read_image",
    "resize",
    "set_default_workers",
    "write_blobproto",
]
