"""How Caffe's Solver finds its nets: the solver file, its train and test net definitions,
and their NetStates (Solver::InitTrainNet / InitTestNets)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from caffe2jax.frontend import caffe_pb2
from caffe2jax.frontend.errors import CaffeError, SolverError
from caffe2jax.frontend.parse import read_message, read_net
from caffe2jax.frontend.upgrade import upgrade_solver
from caffe2jax.runtime.formats.paths import check_snapshot_prefix, short


def read_solver_param(source: Any, dialect: Any = None) -> tuple[caffe_pb2.SolverParameter, Path]:
    """(upgraded SolverParameter, folder its relative paths may be relative to); ``dialect``
    as for a net (a fork's caffe.proto: its fields in the solver's ``net_param``)."""
    if isinstance(source, caffe_pb2.SolverParameter):
        return upgrade_solver(source), Path(".")
    name = "<string>" if isinstance(source, str) and "\n" in source else str(source)
    param = read_message(source, caffe_pb2.SolverParameter, dialect=dialect)
    try:
        param = upgrade_solver(param, name)
    except CaffeError as err:
        raise SolverError(str(err)) from None
    folder = Path(source).parent if name != "<string>" else Path(".")
    problem = check_snapshot_prefix(param.snapshot_prefix)
    if problem:
        raise SolverError(f"{name}: snapshot_prefix {short(param.snapshot_prefix)!r}: {problem}")
    return param, folder


def resolve(path: str, folder: Path) -> Path:
    """A path from a solver file: as given (Caffe: relative to the working directory), else
    relative to the solver file's folder."""
    given = Path(path)
    try:
        if given.exists() or given.is_absolute():
            return given
    except OSError as err:  # a name too long for the file system, say
        raise SolverError(f"net file '{path[:60]}': {err.strerror}") from None
    return folder / given


def net_sources(param: caffe_pb2.SolverParameter, folder: Path) -> tuple[Any, list[Any]]:
    """Caffe's InitTrainNet / InitTestNets choice of net definitions: a NetParameter (the
    solver's ``*net_param``) or the path of a net file."""
    train_fields = [f for f in ("net", "net_param", "train_net", "train_net_param")
                    if param.HasField(f)]  # fmt: skip
    if len(train_fields) != 1:
        raise SolverError(
            "the solver must specify exactly one train net with one of net, net_param, "
            f"train_net, train_net_param (found {len(train_fields) or 'none'})"
        )

    def load(field: str, value: Any) -> caffe_pb2.NetParameter:
        if field.endswith("_param"):
            return value
        path = resolve(value, folder)
        try:
            found = path.exists()
        except OSError as err:
            raise SolverError(f"{field}: net file '{value[:60]}': {err.strerror}") from None
        if not found:
            raise SolverError(f"{field}: net file '{value[:60]}' not found")
        return path  # compiled from its file: errors name the file's lines

    field = train_fields[0]
    train = load(field, getattr(param, field))
    tests = [load("test_net_param", p) for p in param.test_net_param]
    tests += [load("test_net", p) for p in param.test_net]
    generic = "net_param" if param.HasField("net_param") else "net" if param.HasField("net") else ""
    if generic:
        if len(param.test_iter) < len(tests):
            raise SolverError("test_iter must be specified for each test network")
        tests += [train] * (len(param.test_iter) - len(tests))
    elif len(param.test_iter) != len(tests):
        raise SolverError("test_iter must be specified for each test network")
    if param.test_state and len(param.test_state) != len(tests):
        raise SolverError("test_state must be unspecified or specified once per test net")
    if tests and param.test_interval <= 0:
        raise SolverError("test nets need test_interval > 0")
    return train, tests


def net_state(phase: int, net: Any, extra: caffe_pb2.NetState | None, dialect: Any = None):
    """NetState precedence: the phase, then the net's own state (``net``: a NetParameter or
    the path of its file, read in ``dialect``), then the solver's."""
    state = caffe_pb2.NetState(phase=phase)
    own = net if isinstance(net, caffe_pb2.NetParameter) else read_net(net, dialect=dialect)
    state.MergeFrom(own.state)
    if extra is not None:
        state.MergeFrom(extra)
    return state


def check_solver(param: caffe_pb2.SolverParameter, name: str) -> None:
    """The solver checks that need no net (type, hyper-parameters, lr policy), as one
    SolverError naming the solver file ``name``: run before any net is built."""
    from caffe2jax.runtime.train.lr_policy import check_policy
    from caffe2jax.runtime.train.rules import check_rule_params, check_solver_type
    from caffe2jax.runtime.train.solvers import check_solver_param

    check_solver_type(param, name)
    for check in (check_solver_param, check_rule_params, check_policy):
        try:
            check(param)
        except ValueError as err:
            raise SolverError(f"{name}: {err}") from None


LONG_TEST = 1_000_000  # test batches per pass past which a run says what it is in for


def long_test_warnings(param: caffe_pb2.SolverParameter, tests: list[Any]) -> list[str]:
    """What a test pass of ``test_iter`` batches will do, where that is very many: Caffe runs
    them all (each test net's Solver::Test), stopping early only on a stop request."""
    out = []
    for i, iters in enumerate(param.test_iter[: len(tests)]):
        if iters > LONG_TEST:
            out.append(
                f"test_iter {iters} (test net #{i}): every test pass runs {iters} batches, as "
                "Caffe does; Ctrl-C (SIGINT) stops it after the current batch"
            )
    return out
