"""The records data layers read: Caffe's Datum and BlobProto, SSD's AnnotatedDatum, the
LMDB/LevelDB databases that hold them, and which record a reader takes next."""
