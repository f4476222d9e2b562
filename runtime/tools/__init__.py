"""Caffe's tools as functions: convert_imageset and compute_image_mean (:mod:`.imageset`), SSD's
convert_annoset (:mod:`.annoset`), SegNet's BN statistics (:mod:`.bn_stats`), ENet's
BN-absorber (:mod:`.bn_absorb`) and ``caffe time``'s measurements (:mod:`.timing`)."""
