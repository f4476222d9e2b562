import sys

from caffe2jax.cli import main

sys.exit(main())
