"""Cart-Pole as pure, jittable and vmappable JAX functions.

Reproduced behaviour
--------------------
The dynamics, thresholds, reward and episode ends follow Gymnasium's ``CartPoleEnv``
(``gymnasium/envs/classic_control/cartpole.py``, Barto, Sutton & Anderson 1983) plus the
``TimeLimit`` wrapper that ``gymnasium.make`` adds:

* the pole/cart equations of motion (Florian 2007 correction) integrated with explicit
  ``"euler"`` (Gymnasium's default) or ``"semi-implicit euler"``;
* action 1 pushes right with ``+force_mag``, any other action pushes left with ``-force_mag``;
* ``terminated`` once ``|x| > x_threshold`` or ``|theta| > theta_threshold_radians``;
* reward 1.0 for every step including the terminating one, 0.0 for steps taken after
  termination without a reset (Gymnasium's "undefined behaviour" case);
* ``truncated`` once the step count reaches ``max_episode_steps`` (0 disables the cap);
* reset draws every state component uniformly from ``[-reset_noise, reset_noise)``.

Numerics
--------
Gymnasium integrates in float64 and casts the observation to float32. Here the state lives in
float32, so each step adds a rounding error of a few float32 ulps (about 1e-7 relative), and
the upright pole is unstable: a deviation grows e-fold about every 0.25 s (under 10% per step).
Measured against Gymnasium on 300 random-action episodes (8 to 81 steps), the observations
differ by at most 9e-8 after one step and 4.4e-6 ("euler") or 2.9e-5 ("semi-implicit euler",
on its longest episodes) by the time the pole falls. Under bang-bang balancing control the
growth continues until the two runs pick a different action (after ~110-180 steps), so long
episodes agree only statistically; re-synchronised every 25 steps they agree within 7e-7.
Termination is tested on the float32 state, so a state lying within ~1e-6 of a threshold may end
one step earlier or later than in Gymnasium.

MyCaffe's Cart-Pole (``MyCaffe.gym/Gyms/CartPoleGym.cs``) is the same system with a 20 degree
angle limit and no step cap; see :func:`cartpole_mycaffe` for its constants.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

INTEGRATORS = ("euler", "semi-implicit euler")


class CartPoleState(NamedTuple):
    """Per-environment state; a pytree, so batches of it vmap and scan directly."""

    x: jax.Array
    x_dot: jax.Array
    theta: jax.Array
    theta_dot: jax.Array
    t: jax.Array  # int32 steps taken since the last reset
    terminated: jax.Array  # bool, sticky until the next reset


class Transition(NamedTuple):
    """What :func:`step` returns; unpacks like a tuple.

    ``obs`` is the observation to act on next. ``final_obs`` is the observation the transition
    reached: equal to ``obs`` for :func:`step`, and the last observation of the finished episode
    when :func:`step_autoreset` replaced ``obs`` by a fresh reset.
    """

    state: CartPoleState
    obs: jax.Array
    reward: jax.Array
    done: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array

    def replace(self, **changes: Any) -> Transition:
        """A copy with ``changes`` (the tuple's ``_replace``)."""
        return self._replace(**changes)


@dataclasses.dataclass(frozen=True)
class CartPoleParams:
    """Static, hashable Cart-Pole configuration; also the env object returned by ``make_env``.

    Being frozen and hashable it can be a static argument of ``jax.jit`` or closed over.
    ``length`` is half the pole's length, as in Gymnasium and MyCaffe.
    """

    name: str = "CartPole-v1"
    gravity: float = 9.8
    masscart: float = 1.0
    masspole: float = 0.1
    length: float = 0.5
    force_mag: float = 10.0
    tau: float = 0.02
    kinematics_integrator: str = "euler"
    theta_threshold_radians: float = 12 * 2 * math.pi / 360
    x_threshold: float = 2.4
    max_episode_steps: int = 500
    reset_noise: float = 0.05

    num_actions: ClassVar[int] = 2
    obs_shape: ClassVar[tuple[int, ...]] = (4,)

    def __post_init__(self) -> None:
        if self.kinematics_integrator not in INTEGRATORS:
            raise ValueError(
                f"kinematics_integrator must be one of {INTEGRATORS}, "
                f"got {self.kinematics_integrator!r}"
            )
        if self.max_episode_steps < 0:
            raise ValueError(f"max_episode_steps must be >= 0, got {self.max_episode_steps}")
        if not self.reset_noise > 0:
            raise ValueError(f"reset_noise must be > 0, got {self.reset_noise}")

    def reset(self, key: jax.Array) -> tuple[CartPoleState, jax.Array]:
        """Method form of :func:`reset`."""
        return reset(self, key)

    def step(self, state: CartPoleState, action: Any) -> Transition:
        """Method form of :func:`step`."""
        return step(self, state, action)

    def step_autoreset(self, state: CartPoleState, action: Any, key: jax.Array) -> Transition:
        """Method form of :func:`step_autoreset`."""
        return step_autoreset(self, state, action, key)


def cartpole_v1() -> CartPoleParams:
    """Gymnasium ``CartPole-v1``: 12 degree limit, 500 step cap."""
    return CartPoleParams(name="CartPole-v1", max_episode_steps=500)


def cartpole_v0() -> CartPoleParams:
    """Gymnasium ``CartPole-v0``: 12 degree limit, 200 step cap."""
    return CartPoleParams(name="CartPole-v0", max_episode_steps=200)


def cartpole_mycaffe() -> CartPoleParams:
    """MyCaffe's Cart-Pole gym (MyCaffe/MyCaffe, ``MyCaffe.gym/Gyms/CartPoleGym.cs``).

    MyCaffe's ``Step`` returns the state from *before* the update as its observation (a one-step
    lag); the env itself observes the updated state as Gymnasium does, and the trainer
    reproduces the lag with ``stale_observation`` (on by default for cartpole-mycaffe, see
    :mod:`.rollout`). Not modelled: the optional additive-force mode (``Init2=1``, off by
    default).
    """
    return CartPoleParams(
        name="CartPole-MyCaffe",
        gravity=9.8,  # m_dfGravity = 9.8
        masscart=1.0,  # m_dfMassCart = 1.0
        masspole=0.1,  # m_dfMassPole = 0.1
        length=0.5,  # m_dfLength = 0.5, "actually half the pole's length"
        force_mag=10.0,  # m_dfForce = 10 (Initialize: property Init1, default 10)
        tau=0.02,  # m_dfTau = 0.02 seconds between state updates
        kinematics_integrator="euler",  # Step: x += tau * x_dot before x_dot += tau * xacc
        theta_threshold_radians=20 * (math.pi / 180),  # CartPoleState.MAX_THETA
        x_threshold=2.4,  # CartPoleState.MAX_X
        max_episode_steps=0,  # Step never ends an episode on a step count
        reset_noise=0.05,  # Reset: randomUniform(-0.05, 0.05) for all four components
    )


ENVS: dict[str, CartPoleParams] = {
    "cartpole": cartpole_v1(),
    "cartpole-v0": cartpole_v0(),
    "cartpole-v1": cartpole_v1(),
    "cartpole-mycaffe": cartpole_mycaffe(),
}


def make_env(name: str) -> CartPoleParams:
    """Return the built-in JAX environment registered as ``name`` (case-insensitive)."""
    env = ENVS.get(name.strip().lower())
    if env is None:
        known = ", ".join(sorted(ENVS))
        raise ValueError(
            f"unknown JAX environment {name!r}; known names: {known}. "
            "Other Gymnasium environments run on the host via "
            "caffe2jax.runtime.rl.gym_host.HostEnv with a 'gym:<id>' name."
        )
    return env


def _observe(state: CartPoleState) -> jax.Array:
    return jnp.stack([state.x, state.x_dot, state.theta, state.theta_dot], axis=-1)


def reset(params: CartPoleParams, key: jax.Array) -> tuple[CartPoleState, jax.Array]:
    """Start an episode: every component uniform in ``[-reset_noise, reset_noise)``."""
    b = params.reset_noise
    x, x_dot, theta, theta_dot = jax.random.uniform(key, (4,), jnp.float32, -b, b)
    state = CartPoleState(
        x=x,
        x_dot=x_dot,
        theta=theta,
        theta_dot=theta_dot,
        t=jnp.zeros((), jnp.int32),
        terminated=jnp.zeros((), jnp.bool_),
    )
    return state, _observe(state)


def _accelerations(
    params: CartPoleParams, theta: jax.Array, theta_dot: jax.Array, force: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Cart and pole accelerations, with Gymnasium's operation order."""
    total_mass = params.masspole + params.masscart
    polemass_length = params.masspole * params.length
    costheta = jnp.cos(theta)
    sintheta = jnp.sin(theta)
    temp = (force + polemass_length * jnp.square(theta_dot) * sintheta) / total_mass
    thetaacc = (params.gravity * sintheta - costheta * temp) / (
        params.length * (4.0 / 3.0 - params.masspole * jnp.square(costheta) / total_mass)
    )
    xacc = temp - polemass_length * thetaacc * costheta / total_mass
    return xacc, thetaacc


def _integrate(
    params: CartPoleParams, state: CartPoleState, xacc: jax.Array, thetaacc: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    tau = params.tau
    x, x_dot, theta, theta_dot = state.x, state.x_dot, state.theta, state.theta_dot
    if params.kinematics_integrator == "euler":
        x = x + tau * x_dot
        x_dot = x_dot + tau * xacc
        theta = theta + tau * theta_dot
        theta_dot = theta_dot + tau * thetaacc
    else:
        x_dot = x_dot + tau * xacc
        x = x + tau * x_dot
        theta_dot = theta_dot + tau * thetaacc
        theta = theta + tau * theta_dot
    return x, x_dot, theta, theta_dot


def step(params: CartPoleParams, state: CartPoleState, action: Any) -> Transition:
    """Advance one ``tau``; no reset. ``done = terminated | truncated``.

    Stepping past termination keeps integrating (as Gymnasium does) with reward 0.0.
    """
    force = jnp.where(jnp.asarray(action) == 1, params.force_mag, -params.force_mag)
    force = force.astype(jnp.float32)
    xacc, thetaacc = _accelerations(params, state.theta, state.theta_dot, force)
    x, x_dot, theta, theta_dot = _integrate(params, state, xacc, thetaacc)
    fell = (
        (x < -params.x_threshold)
        | (x > params.x_threshold)
        | (theta < -params.theta_threshold_radians)
        | (theta > params.theta_threshold_radians)
    )
    t = state.t + 1
    if params.max_episode_steps > 0:
        truncated = t >= params.max_episode_steps
    else:
        truncated = jnp.zeros((), jnp.bool_)
    reward = jnp.where(state.terminated, 0.0, 1.0).astype(jnp.float32)
    new_state = CartPoleState(x, x_dot, theta, theta_dot, t, state.terminated | fell)
    obs = _observe(new_state)
    return Transition(new_state, obs, reward, fell | truncated, fell, truncated, obs)


def step_autoreset(
    params: CartPoleParams, state: CartPoleState, action: Any, key: jax.Array
) -> Transition:
    """:func:`step`, then reset with ``key`` wherever the episode ended (same-step autoreset).

    ``state``/``obs`` belong to the new episode where ``done``; ``reward``, ``terminated`` and
    ``truncated`` describe the finished transition and ``final_obs`` is its last observation.
    """
    tr = step(params, state, action)
    fresh_state, fresh_obs = reset(params, key)
    new_state = jax.tree.map(lambda a, b: jnp.where(tr.done, a, b), fresh_state, tr.state)
    obs = jnp.where(tr.done[..., None], fresh_obs, tr.obs)
    return tr.replace(state=new_state, obs=obs)
