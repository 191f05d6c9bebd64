"""The conformance runner (``runner``) over ExportDB's supported programs and our own examples (``examples``):
each converts, matches ``ep.module()`` on its example (and extra) inputs, writes the inputs it mutates alike, and
leaves the program as it was. Our examples are converted twice (the second conversion sees what the first left);
ExportDB's once, twice under ``--full-sweep``. ``python -m tests.conformance`` prints every case's result,
ExportDB's not-yet-supported cases too (a measurement outside the suite)."""
import pytest

from ..conftest import full_sweep
from .examples import CASES
from .runner import check, exportdb_cases

EXPORTDB = {case.name: case for case in exportdb_cases()}
OURS = {case.name: case for case in CASES}


def test_exportdb_has_the_cases_we_count():
    assert len(EXPORTDB) == 35  # torch 2.13's supported cases; a new torch may add some: count them here


@pytest.mark.parametrize("name", sorted(EXPORTDB))
def test_exportdb_case(name, request):
    check(EXPORTDB[name], twice=full_sweep(request.config))


@pytest.mark.parametrize("name", sorted(OURS))
def test_our_example(name):
    check(OURS[name], twice=True)
