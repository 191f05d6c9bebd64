"""Fixtures of the trust-boundary tests: the small dynamic artifact (exported once per module) and a fresh bundle
of it per test."""
import pytest

from .bundles import small_artifact


@pytest.fixture(scope="module")
def small():
    """(model, artifact): nn.Linear(8, 4) with a symbolic batch in [2, 16]."""
    return small_artifact()


@pytest.fixture
def saved(small, tmp_path):
    return small[1].save(tmp_path / "bundle")
