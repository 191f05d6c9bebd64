"""A bundle read while it is being replaced: one thread saves two versions of a model in turn to the same path
(same weight shapes, different programs and weights, as a retrained model would be) while reader threads load it
and call it. Every load is one version, whole (its module with its own weights): never a mix, never an error.
A fixed sample of 200 loads runs by default (a few seconds); ``--full-sweep`` runs 400."""

import torch

from torch_stablehlo.exporter import export_to_stablehlo, load_artifact

from ..conftest import full_sweep
from .bundles import loads_while_saving

READERS = 4
TOLERANCE = dict(rtol=1e-5, atol=1e-5)  # f32 matmuls of 8 terms


class Doubled(torch.nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x) + 1


def _versions():
    torch.manual_seed(0)
    first, second = torch.nn.Linear(8, 4).eval(), Doubled(8, 4).eval()
    x = torch.randn(3, 8)
    return x, [(export_to_stablehlo(model, (x,)), model(x).detach()) for model in (first, second)]


def test_loads_while_a_save_replaces_the_bundle_each_see_one_version(request, tmp_path):
    loads_wanted = 400 if full_sweep(request.config) else 200
    x, versions = _versions()
    path = versions[0][0].save(tmp_path / "bundle")
    mixes = [2 * versions[0][1] + 1, (versions[1][1] - 1) / 2]  # each module run with the other's weights

    def outcome() -> str:
        result = load_artifact(path)(x)
        matches = [i for i, (_, expected) in enumerate(versions) if torch.allclose(result, expected, **TOLERANCE)]
        return (f"version {matches[0]}" if matches else
                "a mix" if any(torch.allclose(result, m, **TOLERANCE) for m in mixes) else "wrong")

    outcomes = loads_while_saving([artifact for artifact, _ in versions], path, outcome, loads_wanted, READERS,
                                  pause=0.02)
    wrong = [o for o in outcomes if not o.startswith("version")]
    assert len(outcomes) == loads_wanted and wrong == [], (len(wrong), wrong[:3])
    assert {"version 0", "version 1"} <= set(outcomes), "the loads saw both versions (the saves did overlap them)"
