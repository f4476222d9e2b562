"""pycaffe's ``caffe.io`` helpers: Datum and BlobProto ↔ numpy.

``array_to_datum(arr, label)``, ``datum_to_array(datum)``, ``array_to_blobproto(arr)``,
``blobproto_to_array(blob)``, plus file helpers for mean files (``read_blobproto``,
``write_blobproto``) and encoded images (``encoded_datum``).
"""

from caffe2jax.runtime.data.datum import (
    array_to_blobproto,
    array_to_datum,
    blobproto_to_array,
    datum_to_array,
    encoded_datum,
    parse_datum,
    read_blobproto,
    write_blobproto,
)

__all__ = [
    "array_to_blobproto",
    "array_to_datum",
    "blobproto_to_array",
    "datum_to_array",
    "encoded_datum",
    "parse_datum",
    "read_blobproto",
    "write_blobproto",
]
