"""Cart-Pole JAX environments against Gymnasium, plus the Gymnasium host adapter."""

from __future__ import annotations

import math
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caffe2jax.runtime.rl import envs
from caffe2jax.runtime.rl.gym_host import HostEnv, strip_gym_prefix

try:
    import gymnasium as gym
except ImportError:  # optional extra: the pure-JAX tests still run
    gym = None

needs_gym = pytest.mark.skipif(gym is None, reason="gymnasium is not installed")

TOL = 1e-5


def _jit_step(params: envs.CartPoleParams):
    return jax.jit(lambda s, a: envs.step(params, s, a))


def _gym_env(env_id: str, seed: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CartPole-v0 is flagged as out of date
        env = gym.make(env_id)
    env.reset(seed=seed)
    return env


def _sync(env, state: envs.CartPoleState) -> None:
    """Put our float32 state into Gymnasium's float64 state (exactly representable)."""
    env.unwrapped.state = np.array([state.x, state.x_dot, state.theta, state.theta_dot], np.float64)


def _balance(obs: np.ndarray) -> int:
    """Bang-bang PD controller on the pole angle (with a little cart centring)."""
    x, x_dot, theta, theta_dot = obs
    return int(theta + 0.5 * theta_dot + 0.05 * x + 0.1 * x_dot > 0)


@pytest.mark.parametrize("integrator", envs.INTEGRATORS)
@needs_gym
def test_open_loop_parity_until_termination(integrator):
    params = envs.CartPoleParams(kinematics_integrator=integrator)
    step = _jit_step(params)
    rng = np.random.default_rng(1234)
    worst, lengths = 0.0, []
    for seed in range(8):
        state, obs = envs.reset(params, jax.random.key(seed))
        ref = gym.make("CartPole-v1").unwrapped
        ref.reset(seed=seed)
        ref.kinematics_integrator = integrator
        _sync(ref, state)
        np.testing.assert_array_equal(np.asarray(obs), np.asarray(ref.state, np.float32))
        for t, action in enumerate(rng.integers(0, 2, 400)):
            tr = step(state, int(action))
            state = tr.state
            ref_obs, ref_reward, ref_term, _, _ = ref.step(int(action))
            worst = max(worst, float(np.abs(np.asarray(tr.obs) - ref_obs).max()))
            assert float(tr.reward) == ref_reward == 1.0
            assert bool(tr.terminated) == ref_term, f"seed {seed}: termination at step {t + 1}"
            assert bool(tr.done) == ref_term and not bool(tr.truncated)
            if ref_term:
                lengths.append(t + 1)
                break
        else:
            pytest.fail(f"seed {seed}: random actions never dropped the pole")
    assert worst <= TOL, worst
    assert min(lengths) < max(lengths), "initial states should give different episode lengths"


@needs_gym
def test_step_after_termination_gives_zero_reward_like_gymnasium():
    params = envs.cartpole_v1()
    step = _jit_step(params)
    state, _ = envs.reset(params, jax.random.key(3))
    ref = gym.make("CartPole-v1").unwrapped
    ref.reset(seed=0)
    _sync(ref, state)
    rewards, ref_rewards = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Gymnasium warns about stepping after termination
        for _ in range(40):
            tr = step(state, 1)
            state = tr.state
            _, ref_r, ref_term, _, _ = ref.step(1)
            rewards.append(float(tr.reward))
            ref_rewards.append(ref_r)
            assert bool(tr.terminated) == ref_term
    assert rewards == ref_rewards
    assert rewards[-1] == 0.0 and 1.0 in rewards


@needs_gym
@pytest.mark.parametrize(
    ("params", "env_id", "cap"),
    [(envs.cartpole_v1(), "CartPole-v1", 500), (envs.cartpole_v0(), "CartPole-v0", 200)],
)
def test_balanced_episode_truncates_at_the_cap(params, env_id, cap):
    """Closed loop drifts apart after ~100 steps (bang-bang control amplifies float32 rounding),
    so Gymnasium's state is re-synchronised to ours every 25 steps; in between, observations
    must agree and the TimeLimit wrapper must truncate on the same step as we do."""
    step = _jit_step(params)
    for seed in range(3):
        state, obs = envs.reset(params, jax.random.key(100 + seed))
        ref = _gym_env(env_id, seed)
        for t in range(cap + 10):
            if t % 25 == 0:
                _sync(ref, state)
            action = _balance(np.asarray(obs))
            tr = step(state, action)
            state, obs = tr.state, tr.obs
            ref_obs, _, ref_term, ref_trunc, _ = ref.step(action)
            np.testing.assert_allclose(np.asarray(obs), ref_obs, rtol=0, atol=TOL)
            assert (bool(tr.terminated), bool(tr.truncated)) == (ref_term, ref_trunc)
            if bool(tr.done):
                break
        assert t + 1 == cap and bool(tr.truncated) and not bool(tr.terminated)
        assert int(tr.state.t) == cap


def test_mycaffe_constants_and_registry():
    mc = envs.make_env("cartpole-mycaffe")
    assert mc.theta_threshold_radians == pytest.approx(math.radians(20))
    assert envs.cartpole_v1().theta_threshold_radians == pytest.approx(math.radians(12))
    assert mc.max_episode_steps == 0 and mc.x_threshold == 2.4 and mc.force_mag == 10.0
    assert envs.make_env("cartpole") == envs.cartpole_v1()
    assert envs.make_env("CartPole-v0").max_episode_steps == 200
    for env in envs.ENVS.values():
        assert env.num_actions == 2 and env.obs_shape == (4,)
    with pytest.raises(ValueError, match="cartpole-mycaffe") as err:
        envs.make_env("pendulum")
    assert "cartpole-v0" in str(err.value) and "gym:" in str(err.value)
    with pytest.raises(ValueError, match="kinematics_integrator"):
        envs.CartPoleParams(kinematics_integrator="rk4")


def _tilted(theta: float) -> envs.CartPoleState:
    z = jnp.float32(0.0)
    return envs.CartPoleState(
        z, z, jnp.float32(theta), z, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.bool_)
    )


def test_mycaffe_terminates_at_20_degrees_not_12():
    start = _tilted(math.radians(13))
    assert bool(envs.step(envs.cartpole_v1(), start, 1).terminated)
    mc = envs.cartpole_mycaffe()
    step = _jit_step(mc)
    state, prev_theta = start, float(start.theta)
    for _ in range(100):
        tr = step(state, 0)  # push left: the pole keeps falling to the right
        if bool(tr.terminated):
            break
        state, prev_theta = tr.state, float(tr.state.theta)
    assert bool(tr.terminated) and not bool(tr.truncated)
    assert prev_theta <= math.radians(20) < float(tr.state.theta)


def test_mycaffe_never_truncates():
    mc = envs.cartpole_mycaffe()

    def body(state, _):
        obs = jnp.stack([state.x, state.x_dot, state.theta, state.theta_dot])
        action = (obs[2] + 0.5 * obs[3] + 0.05 * obs[0] + 0.1 * obs[1] > 0).astype(jnp.int32)
        tr = envs.step(mc, state, action)
        return tr.state, (tr.terminated, tr.truncated)

    state, _ = envs.reset(mc, jax.random.key(7))
    final, (term, trunc) = jax.jit(lambda s: jax.lax.scan(body, s, length=3000))(state)
    assert int(final.t) == 3000
    assert not bool(trunc.any()) and not bool(term.any())


def test_jit_vmap_1024_envs_reset_noise_and_autoreset():
    params = envs.cartpole_v1()
    n = 1024
    keys = jax.random.split(jax.random.key(0), n)
    state, obs = jax.jit(jax.vmap(params.reset))(keys)
    obs = np.asarray(obs)
    assert obs.shape == (n, 4) and obs.dtype == np.float32
    assert np.all(np.abs(obs) <= params.reset_noise)
    assert obs.min() < -0.045 and obs.max() > 0.045  # the whole interval is used
    assert len(np.unique(obs, axis=0)) == n  # each key gives its own start

    def rollout(state, key):
        def body(carry, k):
            state, total = carry
            ka, kr = jax.random.split(k)
            actions = jax.random.bernoulli(ka, 0.5, (n,)).astype(jnp.int32)
            tr = jax.vmap(params.step_autoreset)(state, actions, jax.random.split(kr, n))
            return (tr.state, total + tr.reward), (tr.done, tr.obs, tr.final_obs)

        return jax.lax.scan(body, (state, jnp.zeros(n)), jax.random.split(key, 200))

    (end, total), (done, obs_seq, final_seq) = jax.jit(rollout)(state, jax.random.key(1))
    done, obs_seq, final_seq = map(np.asarray, (done, obs_seq, final_seq))
    assert np.asarray(total).min() == np.asarray(total).max() == 200.0  # 1.0 every step
    assert done.sum() > n  # random actions end many episodes
    assert np.all(np.abs(obs_seq[done]) <= params.reset_noise)  # fresh episodes
    assert np.all(obs_seq[~done] == final_seq[~done])
    fell = (np.abs(final_seq[done][:, 0]) > 2.4) | (np.abs(final_seq[done][:, 2]) > 0.2094)
    assert fell.all()
    assert not np.asarray(end.terminated).any()

    # The vmapped step is the single-env step applied row by row (up to an ulp: the vectorised
    # sin/cos kernels may round differently from the scalar ones).
    batch = jax.jit(jax.vmap(params.step))(state, jnp.ones(n, jnp.int32))
    for i in (0, 511, 1023):
        one = params.step(jax.tree.map(lambda a, i=i: a[i], state), 1)
        np.testing.assert_allclose(np.asarray(batch.obs[i]), np.asarray(one.obs), atol=1e-6)


@needs_gym
def test_host_env_runs_cartpole_with_autoreset():
    with HostEnv("gym:CartPole-v1", num_envs=3, seed=5) as env:
        assert env.num_actions == 2 and env.obs_shape == (4,)
        obs = env.reset()
        assert obs.shape == (3, 4) and obs.dtype == np.float32
        ref, _ = gym.make("CartPole-v1").reset(seed=6)
        np.testing.assert_array_equal(obs[1], ref)  # copy i is seeded with seed + i
        ended = 0
        for _ in range(60):
            obs, reward, term, trunc = env.step(np.ones(3, np.int64))  # always push right
            assert obs.shape == (3, 4) and reward.dtype == np.float32
            np.testing.assert_array_equal(reward, 1.0)
            done = term | trunc
            ended += int(done.sum())
            assert np.all(np.abs(obs[done]) <= 0.05)  # replaced by the new episode's start
            assert np.all(np.abs(env.final_obs[done][:, 2]) > 0.2094)
            np.testing.assert_array_equal(obs[~done], env.final_obs[~done])
        assert ended >= 3


@needs_gym
def test_host_env_errors():
    assert strip_gym_prefix("gym:CartPole-v0") == "CartPole-v0"
    with pytest.raises(ValueError, match="unknown Gymnasium environment id 'NoSuchEnv-v0'"):
        HostEnv("gym:NoSuchEnv-v0")
    with pytest.raises(ValueError, match="Discrete"):
        HostEnv("gym:Pendulum-v1")
    env = HostEnv("gym:CartPole-v1", num_envs=2)
    with pytest.raises(RuntimeError, match="before HostEnv.reset"):
        env.step([0, 1])
    env.reset()
    with pytest.raises(ValueError, match="expected 2 actions"):
        env.step([0])
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        env.step([0, 2])
    env.close()


def test_host_env_without_gymnasium_points_at_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    with pytest.raises(ImportError, match=r"pip install caffe2jax\[rl\]"):
        HostEnv("gym:CartPole-v1")
