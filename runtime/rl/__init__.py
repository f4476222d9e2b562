"""Reinforcement learning: MyCaffe's policy-gradient trainer on JAX environments.

``PolicyGradientTrainer(solver)`` trains the policy net a solver prototxt names (MemoryData →
… → Sigmoid/Softmax, with a MemoryLoss layer) on the environment its ``rl_param`` names: the
built-in Cart-Poles (:mod:`.envs`, pure JAX) with each batch of episodes, the learning rule
and the solver update as one XLA program, or any discrete Gymnasium environment
(``gym:<id>``) through a host loop.
"""

from caffe2jax.runtime.rl.config import RLConfig
from caffe2jax.runtime.rl.envs import ENVS, CartPoleParams, make_env
from caffe2jax.runtime.rl.policy import PolicyNet, PolicySpec, RLError
from caffe2jax.runtime.rl.rollout import RolloutOptions, Trajectory
from caffe2jax.runtime.rl.trainer import BatchMetrics, PolicyGradientTrainer, PolicyState, RunResult

__all__ = [
    "ENVS",
    "BatchMetrics",
    "CartPoleParams",
    "PolicyGradientTrainer",
    "PolicyNet",
    "PolicySpec",
    "RLConfig",
    "RLError",
    "RolloutOptions",
    "RunResult",
    "PolicyState",
    "Trajectory",
    "make_env",
]
