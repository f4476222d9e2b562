"""MyCaffe's policy-gradient trainer (MyCaffeTrainerRL, ``PG``) as one jitted program per batch.

``PolicyGradientTrainer(solver)`` reads a solver prototxt (its ``net`` and its ``rl_param``),
compiles the policy net (phase TRAIN) and the solver's update rule (:func:`caffe_solver`), and
``train_batch`` runs ``batch_size`` episodes, the learning rule of :mod:`.rule` and ONE solver
update as a single XLA program for the built-in JAX Cart-Poles. A ``gym:<id>`` environment
runs the same rule with the episodes stepped from a host loop (:class:`.gym_host.HostEnv`).

Reproduced behaviour (MyCaffe/MyCaffe, ``MyCaffe.trainers/pg.st/TrainerPG.cs``, ``Brain.Train``
and ``Agent.Run``): the gradient of every episode is accumulated, and after ``batch_size``
episodes (MyCaffe: ``nIteration % m_nMiniBatch == 0``) the accumulated diffs go through the
solver's ``ApplyUpdate`` once. Not reproduced: MyCaffe passes the episode number as the
iteration to ``ApplyUpdate`` (it matters only to lr policies and Adam's bias correction);
here the solver's ``iter`` counts updates, as Caffe's does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from caffe2jax.frontend import ir
from caffe2jax.lowering.forks import mycaffe as memory_loss  # noqa: F401 - registers MemoryLoss
from caffe2jax.lowering.graph import Params
from caffe2jax.lowering.model import Model
from caffe2jax.lowering.model import compile as compile_net
from caffe2jax.runtime.rl import ale_loop, host_loop, learners, rule
from caffe2jax.runtime.rl import config as rl_config
from caffe2jax.runtime.rl.ale_ffi import AleFfi
from caffe2jax.runtime.rl.ale_ffi import available as ale_ffi_available
from caffe2jax.runtime.rl.ale_program import AleProgram
from caffe2jax.runtime.rl.driver import EnvDriver
from caffe2jax.runtime.rl.jax_loop import JaxLoop
from caffe2jax.runtime.rl.policy import SIGMOID, PolicyNet, RLError
from caffe2jax.runtime.rl.rollout import Lanes, RolloutOptions, Trajectory, new_lanes
from caffe2jax.runtime.rl.state import BatchMetrics, PolicyState
from caffe2jax.runtime.rl.update import PG
from caffe2jax.runtime.train.setup import read_solver_param, resolve
from caffe2jax.runtime.train.solvers import solver_iter
from caffe2jax.runtime.train.step import Trainer, merge, multipliers, split

SOLVED_WINDOW = 100
RUNNING_DECAY = 0.99  # pg-pong's running_reward = running_reward * 0.99 + reward_sum * 0.01


@dataclass
class RunResult:
    """What :meth:`PolicyGradientTrainer.run` did."""

    state: PolicyState
    returns: list[float] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0
    solved_at: int | None = None  # 1-based episode at which the trailing mean hit the target
    solved_mean: float | None = None
    running: float | None = None  # Karpathy's running reward: 0.99 · running + 0.01 · return
    stopped: bool = False  # on_batch asked to stop (Ctrl-C)


def _train_net(param: Any, folder: Any) -> Any:
    """The train net the solver names (exactly one of net, net_param, train_net(_param))."""
    fields = [f for f in ("net", "net_param", "train_net", "train_net_param") if param.HasField(f)]
    if len(fields) != 1:
        raise RLError(
            "the solver must name exactly one train net (net, net_param, train_net "
            f"or train_net_param); found {len(fields) or 'none'}"
        )
    value = getattr(param, fields[0])
    if fields[0].endswith("_param"):
        return value
    path = resolve(value, folder)
    if not path.exists():
        raise RLError(f"{fields[0]}: net file '{value}' not found")
    return path


class PolicyGradientTrainer:
    """Compiles a solver prototxt's policy net and trains it with MyCaffe's PG rule.

    Keyword options override the solver's ``rl_param`` (see :mod:`.config`): ``env``, ``seed``,
    ``batch_size``, ``gamma``, ``horizon``, ``chunk``, ``reset_mode``, ``difference_input``,
    ``stale_observation``, ``normalize_by_length``, ``population_std``, ``target``...
    """

    def __init__(self, solver: Any, **options: Any):
        devices = options.pop("devices", None)
        self.solver_param, folder = read_solver_param(solver)
        self.model: Model = compile_net(_train_net(self.solver_param, folder), phase=ir.TRAIN)
        self.policy = PolicyNet(self.model)
        memory_batch = self.model.inputs[self.policy.spec.data][0]
        self.config = rl_config.from_solver(self.solver_param, memory_batch, **options)
        self.env = None if self.config.on_host else rl_config.make_env(self.config)
        self.host = host_loop.open_env(self.config) if self.config.is_gym else None
        self.ale = ale_loop.open_env(self.config) if self.config.is_ale else None
        self._decode = ale_loop.decoder(self.config) if self.ale else (lambda x: x)
        self._check_env()
        params, state = jax.eval_shape(self.model.init, jax.random.key(0))
        try:  # the solver's update is the runtime's (Caffe's ApplyUpdate as optax)
            self.solver = Trainer(self.model, self.solver_param, params, state)
        except ValueError as err:
            raise RLError(f"solver: {err}") from None
        self.tx = self.solver.tx
        self.learning = self._learning()
        self.mesh = self._mesh(devices)
        self.learn = jax.jit(self.learn_fn)
        self._init = jax.jit(self.model.init)  # one compilation, not one per filler op
        self.driver: EnvDriver = self._driver()

    # -- setup --------------------------------------------------------------------------------

    def _mesh(self, devices: Any) -> Any:
        """Several devices (Caffe's -gpu): the episode batch is split over them, each device
        rolling out batch_size / devices lanes, the rule's gradient summed over all of them
        by XLA's collectives inside the one program; None for one device."""
        if devices is None:
            return None
        from caffe2jax.runtime.parallel.devices import check_batch, make_mesh

        mesh = make_mesh(devices)
        if mesh is not None:
            if self.config.on_host or self.config.horizon is None:
                raise RLError(
                    "several devices need a JAX environment with a step cap (horizon); "
                    f"'{self.config.env}' runs on one device"
                )
            check_batch("rl_param batch_size", self.config.batch_size, mesh)
        return mesh

    def _driver(self) -> EnvDriver:
        """Who plays the episodes: Gymnasium's host loop, the Atari emulators or the JAX
        environment's one program (:mod:`.driver`)."""
        if self.host is not None:
            return host_loop.HostLoop(self)
        if self.ale is not None and self.config.ale_rollout == "program":
            return AleFfi(self) if ale_ffi_available() else AleProgram(self)
        if self.ale is not None:
            return ale_loop.AleLoop(self)
        return JaxLoop(self, self.mesh)

    def place(self, ts: PolicyState) -> PolicyState:
        """``ts`` on the mesh: lanes split along the episode batch, the rest replicated."""
        if self.mesh is None:
            return ts
        from caffe2jax.runtime.parallel.devices import replicated, sharded

        rep, shard = replicated(self.mesh), sharded(self.mesh)
        params, state, opt_state, key, episodes = jax.device_put(
            (ts.params, ts.state, ts.opt_state, ts.key, ts.lanes.episodes), rep
        )
        lanes = Lanes(jax.device_put(ts.lanes.last, shard),
                      jax.device_put(ts.lanes.has_last, shard), episodes)  # fmt: skip
        return PolicyState(params, state, opt_state, key, lanes)

    def _check_env(self) -> None:
        spec = self.policy.spec
        env = self.host or self.ale or self.env
        shape = self.ale.settings.obs_shape if self.ale else env.obs_shape
        actions, obs = env.num_actions, int(np.prod(shape))
        if spec.num_actions != actions:
            raise RLError(
                f"the policy net outputs {spec.num_actions} actions ({spec.kind}) but "
                f"environment '{self.config.env}' has {actions}"
            )
        if self.policy.obs_size != obs:
            raise RLError(
                f"MemoryData takes {self.policy.obs_size} values per step "
                f"({list(spec.step_shape)}) but environment '{self.config.env}' observes {obs}"
            )

    @property
    def rollout_options(self) -> RolloutOptions:
        c = self.config
        return RolloutOptions(
            c.horizon or 0,
            c.chunk,
            c.reset_mode,
            c.difference_input,
            c.stale_observation,
            c.rollout_chunk,
            c.eps_steps,
            c.eps_start,
            c.eps_end,
        )

    @property
    def target(self) -> float | None:
        threshold = self.host.reward_threshold if self.host is not None else None
        return rl_config.default_target(self.config, threshold)

    def init(self, seed: int | None = None) -> PolicyState:
        """Fresh params (Caffe's fillers), solver state, PRNG key and lane memory."""
        seed = self.config.seed if seed is None else seed
        k_init, k_run = jax.random.split(jax.random.key(seed))
        params, state = self._init(k_init)
        opt_state = self.tx.init(merge(params, state))
        lanes = new_lanes(self.config.batch_size, self.policy.obs_size)
        return self.place(PolicyState(params, state, opt_state, k_run, lanes))

    # -- the jitted pieces --------------------------------------------------------------------

    def learn_fn(self, params: Params, state: Params, opt_state: Any, traj: Trajectory) -> tuple:
        """The rule on a batch of episodes, then the update rl_param's ``update`` names
        (default: ONE solver update): ``(params, opt_state)`` (drivers call it jitted, as
        :attr:`learn`, or trace it in their own program)."""
        cfg = self.config
        returns = rule.discounted_returns(
            traj.rewards, traj.mask, cfg.gamma, cfg.allow_discount_reset
        )
        advantage = rule.standardize(returns, traj.mask, cfg.population_std)
        elite = rule.elite_mask(jnp.sum(traj.rewards, axis=0), cfg.episode_elite_percent)
        advantage = advantage * elite
        if cfg.update.type != PG:
            return self.learning.learn(params, state, opt_state, traj, advantage, returns, elite)
        if cfg.update.steps == 1:
            return self._pg_update(params, state, opt_state, traj, advantage)
        return jax.lax.fori_loop(
            0, cfg.update.steps,
            lambda _, c: self._pg_update(c[0], state, c[1], traj, advantage),
            (params, opt_state),
        )  # fmt: skip

    def _pg_update(
        self, params: Params, state: Params, opt_state: Any, traj: Trajectory, advantage: Any
    ) -> tuple:
        """MyCaffe's rule (MemoryLoss's scale, the diffs) and one solver ApplyUpdate."""
        cfg, spec = self.config, self.policy.spec
        by_length = spec.by_length if cfg.normalize_by_length is None else cfg.normalize_by_length
        per_step = spec.per_step if cfg.normalize_by_length is None else 1
        advantage = advantage * rule.loss_scale(traj.mask, spec.loss_weight, per_step, by_length)

        def bottom_of(p: Params, x: jax.Array) -> jax.Array:
            return self.policy.forward(p, state, self._decode(x))[1]

        grads = rule.batch_grads(bottom_of, params, traj, advantage, spec.kind == SIGMOID)
        params, opt_state, _ = self.solver.update(params, state, opt_state, grads)
        return params, opt_state

    def _learning(self) -> learners.Learning:
        """TRPO's and PPO's view of the policy and the solver (:mod:`.learners`)."""

        policy, value = self.policy, self.config.update.value_blob
        value_ssa, value_weight = policy.value_blob(value) if value else (None, 0.0)

        def forward(p: Params, state: Params, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            blobs = policy.blobs(p, state, self._decode(x))
            n = x.shape[0]
            probs = policy.probs_of_bottom(blobs[policy.spec.loss_bottom].reshape(n, -1))
            if value_ssa is None:
                return probs, jnp.zeros((n, 0), probs.dtype)
            return probs, blobs[value_ssa].reshape(n, 1)

        def apply(p: Params, state: Params, o: Any, diff: Params) -> tuple:
            return self.solver.update(p, state, o, diff)[:2]

        if self.config.update.type != PG:
            self.policy.require_differentiable()
        params, state = jax.eval_shape(self.model.init, jax.random.key(0))
        lr, _ = multipliers(self.model, merge(params, state))
        mults = jax.tree.leaves(lr)
        keep = None if all(mults) else jax.tree.map(lambda m: float(m != 0), split(lr, params))
        sigmoid = self.policy.spec.kind == SIGMOID
        return learners.Learning(self.config.update, forward, apply, sigmoid, self.config.seed,
                                 keep, value_weight)  # fmt: skip

    # -- driving ------------------------------------------------------------------------------

    def train_batch(self, ts: PolicyState) -> tuple[PolicyState, BatchMetrics]:
        """One update from ``batch_size`` new episodes (played by :attr:`driver`)."""
        return self.driver.train_batch(ts)

    def run(
        self,
        ts: PolicyState | None = None,
        *,
        episodes: int | None = None,
        target: float | None = None,
        on_batch: Callable[[RunResult, BatchMetrics], bool | None] | None = None,
        start: float | None = None,
        resume: RunResult | None = None,
    ) -> RunResult:
        """Train until the mean return of the last 100 episodes reaches ``target`` (default:
        :attr:`target`) or ``episodes`` (default: rl_param ``max_episodes``) have run, in all.

        ``on_batch`` sees the run after each batch; returning True stops it there
        (``stopped``). ``resume`` continues a run read back by :func:`.snapshot.read_snapshot`:
        its returns, running reward, env steps and clock go on."""
        target = self.target if target is None else target
        limit = episodes if episodes is not None else (self.config.max_episodes or None)
        if target is None and limit is None:
            raise RLError("no target return and no episode limit: give one of them")
        result = resume if resume is not None else RunResult(self.init() if ts is None else ts)
        begin = (time.perf_counter() if start is None else start) - result.seconds
        while limit is None or len(result.returns) < limit:
            result.state, metrics = self.train_batch(result.state)
            result.steps += int(metrics.steps)
            solved = _extend(result, np.asarray(metrics.returns), target)
            result.seconds = time.perf_counter() - begin
            if on_batch is not None and on_batch(result, metrics):
                result.stopped = True
                break
            if solved:
                break
        return result

    def save(self, path: str | os.PathLike, ts: PolicyState, fmt: str | None = None) -> Path:
        """Write the policy's weights as a .caffemodel (``fmt="hdf5"``: Caffe's HDF5)."""
        from caffe2jax.runtime.formats.weights import save_weights

        return save_weights(path, self.model, ts.params, ts.state, format=fmt)

    def iterations(self, ts: PolicyState) -> int:
        """Solver updates applied so far (Caffe's ``iter``)."""
        return solver_iter(ts.opt_state)


def _extend(result: RunResult, returns: np.ndarray, target: float | None) -> bool:
    """Append a batch's returns in episode order, updating the running reward; true once the
    trailing-100 mean reaches ``target`` (recording the episode)."""
    for value in returns.tolist():
        result.returns.append(float(value))
        previous = result.running
        result.running = (
            value
            if previous is None
            else RUNNING_DECAY * previous + (1 - RUNNING_DECAY) * float(value)
        )
        n = len(result.returns)
        if target is None or n < SOLVED_WINDOW:
            continue
        mean = float(np.mean(result.returns[-SOLVED_WINDOW:]))
        if mean >= target:
            result.solved_at, result.solved_mean = n, mean
            return True
    return False
