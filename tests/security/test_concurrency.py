"""Calls from several threads: a program with state is one stream, so the calls on one artifact (and on its JAX
handoff) run one at a time, each taking the state the last one left; no update is lost and no donated buffer is
handed to two executions."""
import threading

import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo

THREADS, CALLS = 4, 200


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("n", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.n.add_(1)
        return x + self.n


def _hammer(call) -> list[int]:
    """``call()`` from THREADS threads, CALLS times each; every value returned, as ints."""
    seen, errors = [], []

    def work():
        try:
            for _ in range(CALLS):
                seen.append(int(call()))
        except Exception as error:  # noqa: BLE001  (reported below, with its thread's result)
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [], errors[:3]
    return seen


@pytest.fixture(scope="module")
def counter():
    return export_to_stablehlo(Counter(), (torch.zeros((), dtype=torch.int64),))


def test_calls_on_a_stateful_artifact_from_several_threads_lose_no_update(counter):
    counter.reset_state()
    zero = torch.zeros((), dtype=torch.int64)
    seen = _hammer(lambda: counter(zero))
    assert sorted(seen) == list(range(1, THREADS * CALLS + 1)), "each call saw the state the one before left"
    assert int(counter.state["n"]) == THREADS * CALLS


def test_calls_on_a_stateful_jax_model_from_several_threads_lose_no_update(counter):
    model = counter.to_jax()
    seen = _hammer(lambda: model(0))
    assert sorted(seen) == list(range(1, THREADS * CALLS + 1))
    assert int(model.state["n"]) == THREADS * CALLS
