"""Running a trained policy (``rl --test``): greedy actions, returns, the GIF render."""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
from PIL import Image

from caffe2jax.cli.main import main
from caffe2jax.runtime.rl import evaluate
from caffe2jax.runtime.rl.envs import cartpole_v1
from caffe2jax.runtime.rl.policy import SIGMOID, SOFTMAX
from caffe2jax.runtime.rl.render import draw_frame
from caffe2jax.runtime.rl.rollout import sample
from caffe2jax.runtime.rl.trainer import PolicyGradientTrainer
from tests.runtime.rl.test_rule import net_text, solver_text


def test_greedy_probs_pick_the_most_probable_action_for_any_draw():
    u = jnp.array([0.0, 0.3, 0.5, 0.999])
    p = jnp.array([[0.2, 0.5, 0.3]] * 4)
    assert sample(SOFTMAX, evaluate.greedy_probs(SOFTMAX, p), u).tolist() == [1, 1, 1, 1]
    a0 = jnp.array([[0.7], [0.3], [0.5], [0.51]])  # P(action 0)
    assert sample(SIGMOID, evaluate.greedy_probs(SIGMOID, a0), u).tolist() == [0, 1, 0, 0]


def test_rl_test_cli_reports_returns_and_renders_a_gif(tmp_path, capsys):
    solver = tmp_path / "solver.prototxt"
    solver.write_text(solver_text(net_text(), "batch_size: 4 max_steps: 60"))
    t = PolicyGradientTrainer(str(solver), seed=0)
    ts = t.init()
    for _ in range(3):
        ts, _ = t.train_batch(ts)
    weights = tmp_path / "policy.caffemodel"
    t.save(weights, ts)
    gif = tmp_path / "out.gif"
    args = ["rl", "--solver", str(solver), "--test", "--weights", str(weights)]
    assert main([*args, "--episodes", "8", "--seed", "1", "--render", str(gif)]) == 0
    out = capsys.readouterr().out
    m = re.search(r"Test: 8 episodes on cartpole \(greedy\): mean return (\d+\.\d) ± ", out)
    assert m, out
    res = evaluate.evaluate(t, ts.params, ts.state, 8, True, 1)
    assert float(m.group(1)) == round(float(np.mean(res.returns)), 1)
    assert res.horizon == 60 and np.all(res.lengths <= 60)
    np.testing.assert_array_equal(res.returns, res.lengths)  # 1 per step on Cart-Pole
    states = evaluate.play_states(t, ts.params, ts.state, True, 1)
    with Image.open(gif) as im:
        assert im.n_frames == len(states) and im.size == (600, 400)
        frame = np.asarray(im.convert("RGB"))
    # the cart (dark) stands near the middle of the track in the first frame
    dark = np.argwhere(frame.sum(-1) < 200)
    assert dark.size and abs(dark[:, 1].mean() - 300) < 40
    assert main([*args[:3], "--test"]) == 1  # no --weights: one clear error


def test_frame_puts_the_pole_where_theta_says():
    env = cartpole_v1()
    left = np.asarray(draw_frame(env, np.array([0.0, 0, -0.5, 0])))
    right = np.asarray(draw_frame(env, np.array([0.0, 0, 0.5, 0])))
    pole = np.array([202, 152, 101])

    def pole_x(frame: np.ndarray) -> float:
        return float(np.argwhere(np.all(frame == pole, axis=-1))[:, 1].mean())

    assert pole_x(left) < 300 < pole_x(right)
