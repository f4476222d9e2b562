import sys

from caffe2jax.cli.main import main

sys.exit(main())
