"""`caffe2jax rl --solver S`: MyCaffe's policy-gradient trainer on Cart-Pole, Atari or gym:ID.

Prints progress every ``--every`` episodes (``Episode E, mean return = R (last 100), running
reward = RR, …, T s``: the lines ``caffe2jax plot`` draws), and once the mean return of the last
100 episodes reaches the target, one line ``Solved: mean return R over the last 100 episodes at
episode E (T s, S env-steps/s)`` and stops. ``T`` counts from the start of the command (net
compilation and XLA compilation included; a resumed run goes on from its snapshot's time);
``S`` counts real environment steps only. Snapshots every ``snapshot`` updates (weights,
solverstate and resume record); ``--snapshot X.solverstate`` resumes exactly. Ctrl-C stops
after the current batch with a snapshot; a second Ctrl-C exits at once.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from caffe2jax.cli.args import Subparsers
from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import CaffeError
from caffe2jax.runtime.host.process import exit_now
from caffe2jax.runtime.rl import envs
from caffe2jax.runtime.rl.trainer import BatchMetrics, PolicyGradientTrainer, RunResult

ENV_HELP = (
    ", ".join(sorted(envs.ENVS)) + ", ALE/<Game>-v5 (Atari), gymnax:<id> or gym:<Gymnasium id>"
)


def add(sub: Subparsers) -> None:
    p = sub.add_parser(
        "rl",
        help="train a MemoryData/MemoryLoss policy net with MyCaffe's policy-gradient rule",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--solver", required=True, help="solver prototxt (net + rl_param)")
    p.add_argument("--env", help=f"environment: {ENV_HELP} (default: rl_param env)")
    p.add_argument("--episodes", type=int, help="stop after this many episodes (in all)")
    p.add_argument("--target", type=float, help="mean return over 100 episodes that solves")
    p.add_argument("--seed", type=int, help="PRNG seed (same seed, same numbers)")
    p.add_argument("--horizon", type=int, help="rollout horizon for envs without a step cap")
    p.add_argument("--gpu", help="split each batch of episodes over devices: 'all' or ids 0,1")
    p.add_argument(
        "--ale-rollout",
        choices=("program", "steps"),
        help="Atari: emulators stepped inside the compiled rollout (program) or between "
        "per-step calls (steps); default: rl_param ale_rollout",
    )
    p.add_argument("--plot", metavar="PNG", help="write a plot of the returns (matplotlib)")
    p.add_argument("--every", type=int, default=100, help="progress line every N episodes")
    p.add_argument("--snapshot-prefix", metavar="P", help="write P_iter_N.* snapshots")
    p.add_argument("--snapshot", metavar="X", help="resume from X.solverstate (exactly)")
    p.add_argument(
        "--test", action="store_true", help="run a trained policy (--weights), no learning"
    )
    p.add_argument("--weights", metavar="W", help="--test: the trained .caffemodel")
    p.add_argument("--sample", action="store_true", help="--test: draw actions (default greedy)")
    p.add_argument("--render", metavar="GIF", help="--test: animate the first episode")
    p.add_argument("--frames", type=int, default=2000, help="--render: at most N Atari frames")
    p.add_argument(
        "--seeds", metavar="LIST", help="train one policy per seed side by side, e.g. 0-15"
    )
    p.set_defaults(func=run)


def _progress(every: int):
    """One line each ``every`` episodes; the rate is over the episodes since the last line."""
    last = {"next": every, "steps": 0, "seconds": 0.0}

    def show(result: RunResult, metrics: BatchMetrics) -> None:
        n = len(result.returns)
        if n < last["next"] or result.solved_at is not None:
            return
        window = result.returns[-100:]
        rate = (result.steps - last["steps"]) / max(result.seconds - last["seconds"], 1e-9)
        last.update(next=(n // every + 1) * every, steps=result.steps, seconds=result.seconds)
        print(
            f"Episode {n}, mean return = {sum(window) / len(window):.1f} (last "
            f"{len(window)}), running reward = {result.running:.3f}, {result.steps} env-steps, "
            f"{rate:.0f} env-steps/s, {result.seconds:.1f} s",
            flush=True,
        )

    def skip_to(result: RunResult) -> None:  # a resumed run's next line
        n = len(result.returns)
        last.update(next=(n // every + 1) * every, steps=result.steps, seconds=result.seconds)

    show.skip_to = skip_to
    return show


def _snapshots(trainer: PolicyGradientTrainer, prefix: str | None):
    """Caffe's snapshot cadence: every ``snapshot`` updates, named by iteration."""
    from caffe2jax.runtime.rl.snapshot import write_snapshot

    hdf5 = trainer.solver_param.snapshot_format == caffe_pb2.SolverParameter.HDF5

    def write(result: RunResult):
        kind = "HDF5 file" if hdf5 else "binary proto file"
        weights, state = write_snapshot(trainer, result, prefix, hdf5)
        print(f"Snapshotting to {kind} {weights}", flush=True)
        print(f"Snapshotting solver state to {kind} {state}", flush=True)
        return state

    return write


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CaffeError("--plot needs matplotlib: pip install matplotlib") from None
    return plt


def _finish(plt, fig, ax, path: str, target: float | None, ylabel: str) -> None:
    """The target line, labels and legend of a return plot, then the file."""
    if target is not None:
        ax.axhline(target, color="k", ls="--", lw=0.8, label=f"target {target:g}")
    ax.set_xlabel("episode")
    ax.set_ylabel(ylabel)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot(path: str, returns: list[float], target: float | None) -> None:
    """Each episode's return, the mean of the last 100 and the running reward (pg-pong's)."""
    import numpy as np

    from caffe2jax.runtime.rl.trainer import RUNNING_DECAY

    plt = _pyplot()
    values = np.asarray(returns)
    episodes = np.arange(1, len(values) + 1)
    window = np.convolve(values, np.ones(100), "full")[: len(values)] / np.minimum(episodes, 100)
    running = np.empty_like(values)
    for i, value in enumerate(values):
        running[i] = value if i == 0 else RUNNING_DECAY * running[i - 1] + 0.01 * value
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(episodes, values, lw=0.6, alpha=0.5, label="return")
    ax.plot(episodes, window, lw=1.8, label="mean of last 100")
    ax.plot(episodes, running, lw=1.2, label="running reward")
    _finish(plt, fig, ax, path, target, "return")


def _test_trainer(args: argparse.Namespace) -> PolicyGradientTrainer:
    if not args.weights:
        raise CaffeError("rl --test needs --weights W (a .caffemodel the trainer wrote)")
    return PolicyGradientTrainer(args.solver, env=args.env, seed=args.seed, horizon=args.horizon)


def run_test(args: argparse.Namespace) -> int:
    """MyCaffe's Test for a PG trainer: play episodes with the trained policy, no learning."""
    import numpy as np

    from caffe2jax.runtime.formats.weights import load_weights
    from caffe2jax.runtime.rl import evaluate, render

    trainer = _test_trainer(args)
    params, state = load_weights(args.weights, trainer.model)
    episodes, greedy, seed = args.episodes or 100, not args.sample, trainer.config.seed
    screens = []
    if trainer.ale is not None:
        from caffe2jax.runtime.rl import ale_eval

        frames = args.frames if args.render else 0
        res, screens = ale_eval.evaluate(trainer, params, state, episodes, greedy, seed, frames)
    else:
        res = evaluate.evaluate(trainer, params, state, episodes, greedy, seed, args.horizon)
    r = res.returns
    print(
        f"Test: {episodes} episodes on {trainer.config.env} ({'greedy' if greedy else 'sampled'}"
        f"): mean return {np.mean(r):.1f} ± {np.std(r):.1f} (min {np.min(r):.0f}, max "
        f"{np.max(r):.0f}); {res.truncated} stopped at the horizon {res.horizon}"
    )
    if args.render and trainer.ale is not None:
        ms = 1000 / 60 * trainer.ale.settings.frameskip  # the 2600 draws 60 frames a second
        render.write_screens(args.render, screens, ms)
        print(f"Wrote {args.render} ({len(screens)} frames)")
    elif args.render:
        states = evaluate.play_states(trainer, params, state, greedy, seed)
        render.write_gif(args.render, trainer.env, states)
        print(f"Wrote {args.render} ({len(states)} frames)")
    return 0


def _plot_seeds(path: str, result, target: float | None) -> None:
    """Median trailing-100 mean over the seeds, with the 25-75% and min-max bands."""
    import numpy as np

    from caffe2jax.runtime.rl.seeds import trailing_means

    plt = _pyplot()
    means = trailing_means(result.returns)
    episodes = np.arange(1, means.shape[1] + 1)
    q = np.percentile(means, [0, 25, 50, 75, 100], axis=0)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.fill_between(episodes, q[0], q[4], alpha=0.15, label="min-max")
    ax.fill_between(episodes, q[1], q[3], alpha=0.35, label="25-75%")
    ax.plot(episodes, q[2], lw=1.8, label=f"median of {len(result.seeds)} seeds")
    _finish(plt, fig, ax, path, target, "mean return of the last 100 episodes")


def run_seeds(args: argparse.Namespace) -> int:
    """``--seeds``: independent policies side by side in one program (vmapped over seeds)."""
    import numpy as np

    from caffe2jax.runtime.rl.seeds import parse_seeds, train_seeds

    start = time.perf_counter()
    if args.plot:
        _pyplot()
    seeds = parse_seeds(args.seeds)
    trainer = PolicyGradientTrainer(args.solver, env=args.env, seed=seeds[0], horizon=args.horizon)
    target = args.target if args.target is not None else trainer.target
    limit = args.episodes or trainer.config.max_episodes
    if not limit:
        raise CaffeError("--seeds needs an episode limit: --episodes N or rl_param max_episodes")
    result = train_seeds(trainer, seeds, limit, target)
    seconds = time.perf_counter() - start
    for seed, at in zip(result.seeds, result.solved_at):
        print(f"Seed {seed}: " + (f"solved at episode {at}" if at else "not solved"))
    hit = [a for a in result.solved_at if a is not None]
    spread = (
        f"; solve episodes median {np.median(hit):.0f}, quartiles "
        f"{np.percentile(hit, 25):.0f}-{np.percentile(hit, 75):.0f}, range {min(hit)}-{max(hit)}"
        if hit
        else ""
    )
    print(
        f"Solved {len(hit)}/{len(seeds)} seeds (target {target:g}){spread} "
        f"({seconds:.1f} s, {result.steps / max(seconds, 1e-9):.0f} env-steps/s)"
    )
    if args.plot:
        _plot_seeds(args.plot, result, target)
        print(f"Wrote {args.plot}")
    return 0


def _stop_on_sigint() -> tuple[dict, object]:
    """Caffe's SIGINT effect "stop" for ``train``: finish the batch, snapshot, stop; a second
    Ctrl-C exits at once (status 130). Returns the request flag and the previous handler."""
    flag = {"stop": False}

    def on_sigint(signum, frame) -> None:
        if flag["stop"]:
            exit_now(130, "caffe2jax rl: interrupted again; exiting now\n")
        flag["stop"] = True
        sys.stderr.write("caffe2jax rl: stopping after this batch (Ctrl-C again: exit now)\n")
        sys.stderr.flush()

    return flag, signal.signal(signal.SIGINT, on_sigint)


def _report(result: RunResult, seconds: float) -> None:
    rate = result.steps / max(seconds, 1e-9)
    window = result.returns[-100:]
    if result.solved_at is not None:
        print(
            f"Solved: mean return {result.solved_mean:.1f} over the last 100 episodes at "
            f"episode {result.solved_at} ({seconds:.1f} s, {rate:.0f} env-steps/s)"
        )
    else:
        word = "Stopped (Ctrl-C)" if result.stopped else "Stopped"
        print(
            f"{word} after {len(result.returns)} episodes: mean return "
            f"{sum(window) / max(len(window), 1):.1f} over the last {len(window)}, running "
            f"reward {result.running if result.running is not None else float('nan'):.3f} "
            f"({seconds:.1f} s, {rate:.0f} env-steps/s)"
        )


def _train(args: argparse.Namespace, trainer: PolicyGradientTrainer, start: float) -> RunResult:
    """The training loop with progress lines, snapshots (the last one also after training,
    Caffe's ``snapshot_after_train``) and Ctrl-C."""
    from caffe2jax.runtime.rl.snapshot import read_snapshot

    prefix = args.snapshot_prefix or trainer.solver_param.snapshot_prefix or None
    every = trainer.solver_param.snapshot
    save = _snapshots(trainer, prefix) if prefix else None
    saved = {"iter": None}
    show = _progress(max(1, args.every))
    resume = read_snapshot(trainer, args.snapshot) if args.snapshot else None
    if resume is not None:
        show.skip_to(resume)
        print(f"Resuming from {args.snapshot} at episode {len(resume.returns)}", flush=True)
    flag, previous = _stop_on_sigint()

    seen = {"iter": trainer.iterations(resume.state) if resume is not None else 0}

    def on_batch(result: RunResult, metrics: BatchMetrics) -> bool:
        show(result, metrics)
        iteration = trainer.iterations(result.state)
        crossed = every and iteration // every > seen["iter"] // every  # PPO: many per batch
        seen["iter"] = iteration
        if save and (crossed or flag["stop"]):
            save(result)
            saved["iter"] = iteration
        return flag["stop"]

    target = args.target if args.target is not None else trainer.target
    try:
        result = trainer.run(episodes=args.episodes, target=target, on_batch=on_batch,
                             start=start, resume=resume)  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    last = trainer.iterations(result.state)
    if save and trainer.solver_param.snapshot_after_train and saved["iter"] != last:
        save(result)
    return result


def _check_args(args: argparse.Namespace) -> None:
    """The flags checked before anything runs (a --plot format matplotlib cannot write used
    to fail only after the whole run)."""
    if args.episodes is not None and args.episodes < 1:
        raise CaffeError(f"--episodes must be >= 1, got {args.episodes}")
    if args.seed is not None and not -(2**63) <= args.seed < 2**63:
        raise CaffeError(f"--seed must fit in 64 bits (int64), got {args.seed}")
    if args.frames < 0:
        raise CaffeError(f"--frames must be >= 0, got {args.frames}")
    if args.plot:
        from pathlib import Path

        plt = _pyplot()
        fig = plt.figure()
        formats = sorted(fig.canvas.get_supported_filetypes())
        plt.close(fig)
        suffix = Path(args.plot).suffix.lstrip(".").lower()
        if suffix not in formats:
            raise CaffeError(f"--plot {args.plot}: matplotlib writes {', '.join(formats)} "
                             f"files, not {suffix or 'a file without an extension'!r}")  # fmt: skip
        if not Path(args.plot).resolve().parent.is_dir():
            raise CaffeError(f"--plot {args.plot}: no such directory")


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    if args.test:
        return run_test(args)
    if args.seeds:
        return run_seeds(args)
    if args.weights or args.render or args.sample:
        raise CaffeError("--weights, --render and --sample go with --test")
    start = time.perf_counter()
    if args.plot:
        _pyplot()  # a missing matplotlib fails now, not after training
    trainer = PolicyGradientTrainer(args.solver, env=args.env, seed=args.seed, horizon=args.horizon,
                                    devices=args.gpu, ale_rollout=args.ale_rollout)  # fmt: skip
    cfg, spec = trainer.config, trainer.policy.spec
    print(
        f"Environment {cfg.env}, {spec.kind} policy with {spec.num_actions} actions, "
        f"{cfg.batch_size} episodes per update, seed {cfg.seed}",
        flush=True,
    )
    result = _train(args, trainer, start)
    _report(result, time.perf_counter() - start)
    if args.plot:
        _plot(args.plot, result.returns, args.target if args.target is not None else trainer.target)
        print(f"Wrote {args.plot}")
    sys.stdout.flush()
    return 0
