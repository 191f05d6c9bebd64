"""Every golden model through every serving path: the bundle loaded in a new process, the TF SavedModel
(in process and through saved_model_cli) and the JAX handoff, each against the stored eager outputs and
against the PJRT run (see ``tools.serving``). One test, so the subprocesses are shared across models."""
from torch_stablehlo.golden import zoo
from torch_stablehlo.tools.serving import check_serving, render


def test_every_golden_model_through_every_serving_path(tmp_path):
    results = check_serving(zoo.names(), tmp_path)
    assert [r.name for r in results if not r.ok] == [], render(results)
