"""How the policy-gradient trainer meets an environment: one driver protocol.

:class:`~caffe2jax.runtime.rl.trainer.PolicyGradientTrainer` trains one batch at a time by
calling its driver's :meth:`EnvDriver.train_batch`; a driver plays ``batch_size`` episodes its
own way and hands the padded trajectory to the trainer's learning step
(:meth:`Learner.learn`: MyCaffe's rule and ONE solver update, one jitted program). Three
drivers: the JAX environments' (:mod:`.jax_loop`: episodes, rule and update in one program),
Gymnasium's host loop (:mod:`.host_loop`) and the Atari emulators' (:mod:`.ale_loop`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from caffe2jax.lowering.graph import Params
    from caffe2jax.runtime.rl.config import RLConfig
    from caffe2jax.runtime.rl.policy import PolicyNet
    from caffe2jax.runtime.rl.rollout import Trajectory
    from caffe2jax.runtime.rl.state import BatchMetrics, PolicyState


class Learner(Protocol):
    """What a driver may use of the trainer."""

    config: RLConfig
    policy: PolicyNet

    def learn(self, params: Params, state: Params, opt_state: Any, traj: Trajectory) -> tuple:
        """The rule on a batch of episodes, then ONE solver update: ``(params, opt_state)``
        (jitted)."""
        ...

    def learn_fn(self, params: Params, state: Params, opt_state: Any, traj: Trajectory) -> tuple:
        """:meth:`learn` unjitted, to trace inside a driver's own program."""
        ...


class EnvDriver(Protocol):
    """Plays the episodes of one batch and learns from them."""

    def train_batch(self, ts: PolicyState) -> tuple[PolicyState, BatchMetrics]:
        """``batch_size`` new episodes with ``ts``'s params, then the trainer's learning
        step: the next state and the batch's metrics."""
        ...
