"""Golden models through every serving path: the bundle loaded in a new process, the TF SavedModel (in process
and through saved_model_cli) and the JAX handoff, each against the stored eager outputs and against the PJRT run
(see ``tools.serving``). One test, so the subprocesses are shared across models.

``make test`` takes a fixed sample with one model of each kind the paths treat differently (a plain MLP, a
decoder with attention and a KV-free forward, an int8 model, control flow); ``--full-sweep`` takes the whole zoo."""
from torch_stablehlo.golden import zoo
from torch_stablehlo.tools.serving import check_serving, render

from ..conftest import full_sweep

SAMPLE = ["mlp", "gpt2_2layer", "mlp_int8", "cond_heads"]


def test_golden_models_through_every_serving_path(tmp_path, request):
    names = zoo.names() if full_sweep(request.config) else SAMPLE
    assert set(SAMPLE) <= set(zoo.names())
    results = check_serving(names, tmp_path)
    assert [r.name for r in results] == names
    assert [r.name for r in results if not r.ok] == [], render(results)
