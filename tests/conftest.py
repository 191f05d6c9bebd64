"""Test distribution under ``pytest -n auto`` (``ModuleScheduling``): each test module stays on one worker (its
module fixtures, such as exported golden models, are built once, and pytest's grouping of the tests by a module
fixture's parameter holds), except the OpInfo sweep, whose hundreds of independent tests spread over every worker,
and the documented commands (each its own subprocess).

``--full-sweep`` (or ``TORCH_STABLEHLO_FULL_SWEEP=1``) makes ``tests/tools/test_opinfo_sweep.py`` check every
OpInfo entry instead of its fixed sample (see that module), and runs the tests marked ``full_sweep_only`` (too slow
for ``make test``'s budget: Ray Serve replicas), which ``make test`` deselects. ``--documented-commands`` (or
``TORCH_STABLEHLO_DOCUMENTED_COMMANDS``) picks which of README's and the Makefile's commands
``tests/test_documented_commands.py`` runs: ``fast`` (the default, in ``make test``: a fixed share of those that take
seconds), ``slow`` (the rest, those that take a minute or more included; ``.ci/run``) or ``all``
(``make check-commands``). At the end of a session the time spent per test
directory (setup, call and teardown, summed over workers) is printed.

Every test starts from torch's seed 0, so the random inputs a test draws do not depend on which tests ran before
it on its worker."""
import os
from collections import defaultdict
from pathlib import PurePosixPath

import pytest
import torch
from xdist.scheduler import LoadScopeScheduling

SPREAD = {"test_opinfo_sweep.py", "test_documented_commands.py"}
_SECONDS = defaultdict(float)
_COUNTS = defaultdict(set)


def pytest_addoption(parser):
    parser.addoption("--full-sweep", action="store_true", default=False,
                     help="OpInfo sweep: check every op_db entry against docs/coverage.json, not the fixed sample "
                          "(also TORCH_STABLEHLO_FULL_SWEEP=1)")
    parser.addoption("--documented-commands", choices=["fast", "slow", "all"], default=None,
                     help="tests/test_documented_commands.py: run README's and the Makefile's fast commands (the "
                          "default), the slow ones, or all (also TORCH_STABLEHLO_DOCUMENTED_COMMANDS)")


def full_sweep(config) -> bool:
    return config.getoption("--full-sweep") or os.environ.get("TORCH_STABLEHLO_FULL_SWEEP", "") not in ("", "0")


def sampled(metafunc, argname: str, every, sample, **parametrize):
    """Parametrize ``argname`` over ``every`` (or what calling it returns: costly lists are made only under the
    sweep) under ``--full-sweep``, else over its fixed ``sample`` (make test's share of a wide check, each entry
    one of ``every``)."""
    if not full_sweep(metafunc.config):
        metafunc.parametrize(argname, list(sample), **parametrize)
        return
    every = list(every() if callable(every) else every)
    assert all(item in every for item in sample), [item for item in sample if item not in every]
    metafunc.parametrize(argname, every, **parametrize)


def documented_commands(config) -> str:
    return config.getoption("--documented-commands") or os.environ.get("TORCH_STABLEHLO_DOCUMENTED_COMMANDS") \
        or "fast"


@pytest.fixture(autouse=True)
def _seeded():
    # the CPU generator alone: torch.manual_seed also queues seeds for CUDA, XPU and MTIA, each with the caller's
    # stack formatted (a few ms per test under pytest's deep stack)
    torch.random.default_generator.manual_seed(0)


def pytest_configure(config):
    config.addinivalue_line("markers", "full_sweep_only: run only with --full-sweep (make test-full)")
    config.addinivalue_line("markers", "fast_commands_only: make test's documented checks, left out by "
                                       "--documented-commands slow (CI's second step runs only the slow ones)")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if not full_sweep(config):
        _deselect(config, items, "full_sweep_only")
    if documented_commands(config) == "slow":
        _deselect(config, items, "fast_commands_only")


def _deselect(config, items, marker: str) -> None:
    """Leave out (deselect, not skip) the items marked ``marker``."""
    left_out = [item for item in items if item.get_closest_marker(marker)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker(marker)]


class ModuleScheduling(LoadScopeScheduling):
    """pytest-xdist's scope scheduling with a test module as the scope (``SPREAD``'s tests each their own), the
    modules with the most tests sent first. (``--dist loadgroup`` with an ``xdist_group`` per module did this
    until pytest 9 moved the node id that pytest-xdist 3.8 renames to mark the group: every test became its own
    scope, modules ran on both workers and their module fixtures were built again and again.)"""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return nodeid if PurePosixPath(module).name in SPREAD else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return ModuleScheduling(config, log)


def pytest_runtest_logreport(report):
    """Runs where the reports arrive (the controller under xdist): time per directory of test modules."""
    directory = str(PurePosixPath(report.nodeid.split("::")[0]).parent)
    _SECONDS[directory] += report.duration
    _COUNTS[directory].add(report.nodeid)


def pytest_terminal_summary(terminalreporter):
    if not _SECONDS:
        return
    terminalreporter.section("time per test directory (summed over workers)")
    for directory, seconds in sorted(_SECONDS.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f}s  {len(_COUNTS[directory]):5d} tests  {directory}")
    terminalreporter.write_line(f"{sum(_SECONDS.values()):8.1f}s  {sum(map(len, _COUNTS.values())):5d} tests  total")
