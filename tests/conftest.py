"""Test distribution under ``pytest -n auto --dist loadgroup``: each test module stays on one worker (its
module fixtures, such as exported golden models, are built once), except the OpInfo sweep, whose hundreds
of independent tests spread over every worker."""
import pytest

SPREAD = {"test_opinfo_sweep.py"}


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): tests that pytest-xdist keeps on one worker")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name not in SPREAD:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
