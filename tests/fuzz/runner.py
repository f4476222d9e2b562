"""Runs fuzz cases in a worker subprocess with a memory limit and a time limit per case.

The worker (``python -m tests.fuzz.runner --worker ...``) sets ``RLIMIT_AS`` before importing
anything, builds the seeds, then for each case prints ``S kind i`` and, when it ends, ``R kind
i status seconds message``. Status: ``ok`` (read fine), ``clean`` (a one-line CaffeError),
``bad`` (any other exception, MemoryError included: the limit was hit), ``timeout`` (over the
per-case limit, enforced with SIGALRM). The parent reads those lines; a worker that dies
(signal, abort) or stops answering mid-case is recorded as ``crash``/``hang`` for that case
and a new worker continues after it.
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import resource
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MEMORY_LIMIT = 2 << 30  # bytes of address space for the worker (JAX itself needs ~1 GiB)
CASE_SECONDS = 10.0  # per case, SIGALRM in the worker
HANG_SECONDS = 60.0  # the parent's watchdog: no answer at all for this long
MAX_MESSAGE = 400


class CaseTimeout(BaseException):
    """Raised by SIGALRM inside a case (a BaseException: project code cannot swallow it)."""


@dataclass
class Result:
    kind: str
    index: int
    status: str
    seconds: float
    message: str = ""


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)

    def counts(self) -> Counter:
        return Counter((r.kind, r.status) for r in self.results)

    def failures(self) -> list[Result]:
        return [r for r in self.results if r.status not in ("ok", "clean")]

    def summary(self) -> str:
        by_kind: dict[str, Counter] = {}
        for r in self.results:
            by_kind.setdefault(r.kind, Counter())[r.status] += 1
        lines = []
        for kind, counts in sorted(by_kind.items()):
            secs = [r.seconds for r in self.results if r.kind == kind]
            lines.append(
                f"{kind:12s} {sum(counts.values()):6d} cases  "
                + "  ".join(f"{s} {n}" for s, n in sorted(counts.items()))
                + f"  max {max(secs):.2f}s"
            )
        return "\n".join(lines)


def case_rng(seed: int, kind: str, index: int) -> random.Random:
    """The case's own generator: any case is reproduced from (seed, kind, index) alone."""
    return random.Random(f"{seed}:{kind}:{index}")


# -- worker -------------------------------------------------------------------------------


def _alarm(signum, frame):
    raise CaseTimeout()


def _one(fn, seeds, rng, work) -> tuple[str, str]:
    from caffe2jax.frontend.errors import CaffeError

    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    try:
        fn(seeds, rng, work)
        return "ok", ""
    except CaseTimeout:
        return "timeout", f"over {CASE_SECONDS}s"
    except CaffeError as err:
        text = str(err)
        if "\n" in text or len(text) > MAX_MESSAGE:
            return "bad", f"message not one short line ({len(text)} chars): {text[:200]!r}"
        return "clean", text
    except BaseException as err:  # noqa: BLE001 - everything else is the finding
        where = traceback.extract_tb(err.__traceback__)[-1]
        short = " ".join(str(err).split())[:200]
        return "bad", f"{type(err).__name__}: {short} at {where.filename}:{where.lineno}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def worker(seed: int, plan: list[tuple[str, int, int]], work: Path) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import logging

    logging.disable(logging.CRITICAL)
    from tests.fuzz.targets import KINDS, make_seeds

    signal.signal(signal.SIGALRM, _alarm)
    seeds = make_seeds(work / "seeds")
    for kind, start, count in plan:
        case_dir = work / kind
        case_dir.mkdir(exist_ok=True)
        for index in range(start, start + count):
            print(f"S {kind} {index}", flush=True)
            begin = time.perf_counter()
            status, message = _one(KINDS[kind], seeds, case_rng(seed, kind, index), case_dir)
            spent = time.perf_counter() - begin
            print(f"R {kind} {index} {status} {spent:.4f} {message}".replace("\n", " "), flush=True)


# -- parent -------------------------------------------------------------------------------


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def _spawn(seed: int, plan: list[tuple[str, int, int]], work: Path) -> subprocess.Popen:
    spec = ",".join(f"{k}:{s}:{n}" for k, s, n in plan if n > 0)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fuzz.runner",
            "--worker",
            "--seed",
            str(seed),
            "--plan",
            spec,
            "--work",
            str(work),
        ],  # fmt: skip
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=open(work / "worker.err", "a"),  # noqa: SIM115 - the child owns it
        text=True,
        env=env,
    )


def run(counts: dict[str, int], seed: int, work: Path) -> Report:
    """Run ``counts[kind]`` cases of each kind; a dead worker is replaced after its case."""
    work.mkdir(parents=True, exist_ok=True)
    report = Report()
    plan = [(kind, 0, n) for kind, n in counts.items() if n > 0]
    while plan:
        proc = _spawn(seed, plan, work)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
        current, started, done = None, time.monotonic(), set()
        while True:
            try:
                line = lines.get(timeout=HANG_SECONDS)
            except queue.Empty:
                proc.kill()
                line = None
                status = "hang"
            else:
                status = "crash"
            if line is None:
                proc.wait()
                if current is not None:
                    spent = time.monotonic() - started
                    code = proc.returncode
                    report.results.append(Result(*current, status, spent, f"exit {code}"))
                    done.add(current)
                break
            tag, kind, index, *rest = line.split(" ", 5)
            if tag == "S":
                current, started = (kind, int(index)), time.monotonic()
            elif tag == "R":
                status, seconds = rest[0], float(rest[1])
                message = rest[2] if len(rest) > 2 else ""
                report.results.append(Result(kind, int(index), status, seconds, message))
                done.add((kind, int(index)))
                current = None
        if not done:  # died before its first case: nothing will get further
            err = (work / "worker.err").read_text()[-300:]
            kind, start, _ = plan[0]
            report.results.append(Result(kind, start, "crash", 0.0, f"worker failed: {err}"))
            return report
        plan = _remaining(plan, done)
    return report


def _remaining(plan, done) -> list[tuple[str, int, int]]:
    out = []
    for kind, start, count in plan:
        finished = [i for (k, i) in done if k == kind and start <= i < start + count]
        if not finished:
            out.append((kind, start, count))
            continue
        last = max(finished)
        if last + 1 < start + count:
            out.append((kind, last + 1, start + count - last - 1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plan", default="")
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args()
    plan = [(k, int(s), int(n)) for k, s, n in (p.split(":") for p in args.plan.split(",") if p)]
    worker(args.seed, plan, args.work)


if __name__ == "__main__":
    main()
