"""Runs fuzz cases in worker subprocesses with a memory limit and a time limit per case.

A worker (``python -m tests.fuzz.runner --worker ...``) sets ``RLIMIT_AS`` (4 GiB) before
importing anything, reads the seeds (built once per run by a first worker), then for each case
prints ``S kind i`` and, when it ends, ``R kind i status seconds message``. Status: ``ok`` (read
fine), ``clean`` (a one-line CaffeError of at most :data:`MAX_MESSAGE` characters), ``bad``
(any other exception, MemoryError included: the limit was hit), ``timeout`` (over the
per-case limit, 60 s, enforced with SIGALRM). The parent reads those lines; a worker that dies
(signal, abort) or stops answering mid-case is recorded as ``crash``/``hang`` for that case
and a new worker continues after it. Cases run in chunks (a fresh worker per chunk, so that
nothing a case leaves behind grows without bound), ``jobs`` workers at a time.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MEMORY_LIMIT = 4 << 30  # bytes of address space for the worker (JAX itself needs ~1.5 GiB)
CASE_SECONDS = 60.0  # per case, SIGALRM in the worker
HANG_SECONDS = 90.0  # the parent's watchdog: no answer at all for this long
MAX_MESSAGE = 320  # a refusal fits a terminal line or two (frontend/errors.py MAX_MESSAGE)
# cases per worker (others: CHUNK_DEFAULT)
CHUNK = {"net": 300, "cli": 60, "pycaffe": 80, "fork_params": 120, "new_verbs": 50}
CHUNK_DEFAULT = 250


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
    sys.path.insert(0, str(ROOT))  # the cases change folders
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import logging

    logging.disable(logging.CRITICAL)
    import jax

    from tests.fuzz.targets import HEAVY, KINDS, make_seeds

    signal.signal(signal.SIGALRM, _alarm)
    seeds = make_seeds(work / "seeds")
    for kind, start, count in plan:
        case_dir = work / f"{kind}.{start}"
        case_dir.mkdir(exist_ok=True)
        for index in range(start, start + count):
            print(f"S {kind} {index}", flush=True)
            os.chdir(case_dir)  # what a case writes by relative path stays in its folder
            begin = time.perf_counter()
            status, message = _one(KINDS[kind], seeds, case_rng(seed, kind, index), case_dir)
            spent = time.perf_counter() - begin
            print(f"R {kind} {index} {status} {spent:.4f} {message}".replace("\n", " "), flush=True)
            if kind in HEAVY:
                jax.clear_caches()


# -- parent -------------------------------------------------------------------------------


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def _spawn(seed: int, plan: list[tuple[str, int, int]], work: Path) -> subprocess.Popen:
    spec = ",".join(f"{k}:{s}:{n}" for k, s, n in plan if n > 0)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1",
           "CAFFE2JAX_CACHE_DIR": str(work / "xla-cache")}  # fmt: skip
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


def _run_plan(seed: int, plan: list[tuple[str, int, int]], work: Path) -> list[Result]:
    """Run ``plan`` in a worker; a dead worker is replaced after its case."""
    results: list[Result] = []
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
                    results.append(Result(*current, status, spent, f"exit {code}"))
                    done.add(current)
                break
            tag, kind, index, *rest = line.split(" ", 5)
            if tag == "S":
                current, started = (kind, int(index)), time.monotonic()
            elif tag == "R":
                status, seconds = rest[0], float(rest[1])
                message = rest[2] if len(rest) > 2 else ""
                results.append(Result(kind, int(index), status, seconds, message))
                done.add((kind, int(index)))
                current = None
        if not done:  # died before its first case: nothing will get further
            err = (work / "worker.err").read_text()[-300:]
            kind, start, _ = plan[0]
            results.append(Result(kind, start, "crash", 0.0, f"worker failed: {err}"))
            return results
        plan = _remaining(plan, done)
    return results


def chunks(counts: dict[str, int], start: int = 0) -> list[list[tuple[str, int, int]]]:
    """Each kind's cases ``start``.. as plans of at most :data:`CHUNK` cases."""
    plans = []
    for kind, n in counts.items():
        size = CHUNK.get(kind, CHUNK_DEFAULT)
        plans += [[(kind, i, min(size, start + n - i))] for i in range(start, start + n, size)]
    return plans


def run(
    counts: dict[str, int],
    seed: int,
    work: Path,
    jobs: int = 2,
    start: int = 0,
    sink: Callable[[list[Result]], None] | None = None,
) -> Report:
    """Run ``counts[kind]`` cases of each kind (case numbers ``start``..), ``jobs`` workers at
    a time, after one worker has built the seeds; ``sink`` gets each chunk's results as they
    come (a long run's partial table)."""
    work.mkdir(parents=True, exist_ok=True)
    report = Report()
    first = _spawn(seed, [], work)
    first.communicate()
    if first.returncode:
        err = (work / "worker.err").read_text()[-300:]
        report.results.append(Result("seeds", 0, "crash", 0.0, f"seeds failed: {err}"))
        return report
    plans = queue.Queue()
    for plan in sorted(chunks(counts, start), key=lambda p: p[0][0] not in CHUNK):
        plans.put(plan)  # the slow kinds first, so that the workers finish together
    lock = threading.Lock()

    def pull() -> None:
        while True:
            try:
                plan = plans.get_nowait()
            except queue.Empty:
                return
            results = _run_plan(seed, plan, work)
            with lock:
                report.results.extend(results)
                if sink is not None:
                    sink(results)

    threads = [threading.Thread(target=pull) for _ in range(max(1, jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
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
