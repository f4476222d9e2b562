"""One module per data layer type: the host-side source that reads its records."""
