"""A net's results on the host: detections (:mod:`.detections`), segmentation label maps
(:mod:`.segment`) and CTC decoding (:mod:`.ctc_decode`)."""
