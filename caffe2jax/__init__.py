"""caffe2jax: compile Caffe nets and solvers to JAX/XLA."""

__version__ = "0.1.0"
