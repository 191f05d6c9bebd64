"""One module for several platforms (``export_to_stablehlo(..., platforms=("cpu", "cuda"))``), as jax.export makes
it: ``@main`` takes the platform index first, and a ``stablehlo.case`` on it runs each platform's lowering where
they differ. Only the CPU branch runs here (no GPU): the CUDA variant computes twice the CPU one, so a wrong
branch taken would fail the comparisons with eager."""
import json
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jaxlib.mlir import ir
from torch.export import Dim

from torch_stablehlo import exporter, load_artifact
from torch_stablehlo.exporter import LoweringError, StableHLOArtifact, export_to_stablehlo
from torch_stablehlo.runtime import pjrt
from torch_stablehlo.stablehlo_ir.mlir_context import make_context
from torch_stablehlo.stablehlo_ir.platforms import cases_as_ifs
from torch_stablehlo.tools.inspection import bundle_report, format_report
from tests.extensions.ops import Softsign, doubled_by_pallas

TOLERANCE = dict(rtol=1e-5, atol=1e-5)  # float32: the same formula in JAX and torch
OP = torch.ops.kx.softsign_scale.default


def softsign(x, w):
    return x / (1 + jnp.abs(x)) * w


def doubled_softsign(x, w):
    """The CUDA variant: twice the right value, so that running its branch on CPU would fail."""
    return 2 * softsign(x, w)


def _model():
    torch.manual_seed(0)
    return Softsign().eval()


@pytest.fixture(scope="module")
def exported():
    """A dynamic-batch export for CPU and CUDA, with the CUDA variant registered beside the default lowering."""
    model = _model()
    with exporter.scoped_lowering(OP, softsign), exporter.scoped_lowering(OP, doubled_softsign, platform="cuda"):
        artifact = export_to_stablehlo(model, (torch.randn(3, 8),), dynamic_shapes=({0: Dim("batch", max=64)},),
                                       platforms=("cpu", "cuda"))
    return model, artifact


def test_main_takes_the_platform_index_and_a_case_runs_each_platforms_lowering(exported):
    model, artifact = exported
    text = artifact.stablehlo_text
    assert re.search(r'@main\(%arg0: tensor<i32> \{jax.global_constant = "_platform_index"\}', text)
    assert '"stablehlo.case"(%arg0) ({' in text
    functions = re.findall(r"func\.func private @(jax_user_kx_softsign_scale_default_\w+)\(", text)
    assert len(set(functions)) == 2  # one per platform, each called from its branch
    assert artifact.platforms == ("cpu", "cuda") and artifact.platform == "cpu"
    for batch in (3, 10):  # the CPU branch ran: the CUDA one doubles
        x = torch.randn(batch, 8)
        torch.testing.assert_close(artifact(x), model(x), **TOLERANCE)


def test_the_bundle_records_the_platforms_and_runs_in_a_process_that_never_registered_the_op(exported, tmp_path):
    model, artifact = exported
    path = artifact.save(tmp_path / "both")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["signature"]["platforms"] == ["cpu", "cuda"]
    assert "platforms: cpu, cuda (@main takes the platform index first)" in format_report(bundle_report(path))
    x = torch.randn(5, 8)
    fresh = ("import json, sys, torch\nfrom torch_stablehlo import load_artifact\n"
             "assert not hasattr(torch.ops.kx, 'softsign_scale')\nartifact = load_artifact(sys.argv[1])\n"
             "print(json.dumps([artifact.platforms, artifact(torch.tensor(json.loads(sys.argv[2]))).tolist()]))")
    run = subprocess.run([sys.executable, "-c", fresh, str(path), json.dumps(x.tolist())], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    platforms, result = json.loads(run.stdout)
    assert platforms == ["cpu", "cuda"]
    torch.testing.assert_close(torch.tensor(result), model(x), **TOLERANCE)


def test_to_jax_lists_both_platforms_and_jax_passes_the_index(exported):
    model, artifact = exported
    jax_model = artifact.to_jax()
    assert jax_model.exported.platforms == ("cpu", "cuda")
    assert len(jax_model.exported.in_avals) == 2  # the weight and x: jax adds the platform index itself
    x = torch.randn(6, 8)
    np.testing.assert_allclose(np.asarray(jax_model(x.numpy())), model(x).detach().numpy(), **TOLERANCE)
    restored = jax.export.deserialize(jax_model.exported.serialize())
    assert restored.platforms == ("cpu", "cuda")


def test_the_saved_model_lists_both_platforms_and_runs_on_cpu(exported, tmp_path):
    tf = pytest.importorskip("tensorflow")
    model, artifact = exported
    loaded = tf.saved_model.load(str(artifact.save_tf_saved_model(tmp_path / "tf")))
    graph = loaded.signatures["serving_default"].graph.as_graph_def()
    calls = [node for function in graph.library.function for node in function.node_def if node.op == "XlaCallModule"]
    assert [p.decode() for p in calls[0].attr["platforms"].list.s] == ["CPU", "CUDA"]
    x = torch.randn(4, 8)
    (served,) = loaded.signatures["serving_default"](x=tf.constant(x.numpy())).values()
    np.testing.assert_allclose(served.numpy(), model(x).detach().numpy(), **TOLERANCE)


def test_a_model_whose_lowerings_agree_takes_the_index_unused_and_runs():
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.GELU()).eval(), torch.randn(2, 8)
    artifact = export_to_stablehlo(model, (x,), platforms=("cuda", "cpu"))
    assert '@main(%arg0: tensor<i32> {jax.global_constant = "_platform_index"}' in artifact.stablehlo_text
    assert "stablehlo.case" not in artifact.stablehlo_text
    assert artifact.platforms == ("cuda", "cpu") and artifact.platform == "cpu"
    torch.testing.assert_close(artifact(x), model(x), **TOLERANCE)
    on_tpu = StableHLOArtifact(artifact.stablehlo_text, artifact.signature, artifact.weights, platform="tpu")
    with pytest.raises(ValueError, match="lowered for the platforms cuda, cpu, not for 'tpu'"):
        on_tpu(x)


def test_a_cuda_kernel_in_the_other_branch_does_not_stop_the_cpu_run():
    """The CUDA variant is a Pallas kernel (not the op's value): lowered here, never run, the CPU branch runs."""
    torch.manual_seed(0)
    model, x = Softsign(128).eval(), torch.randn(8, 128)
    with exporter.scoped_lowering(OP, softsign), \
            exporter.scoped_lowering(OP, lambda x, w: doubled_by_pallas(x), platform="cuda"):
        artifact = export_to_stablehlo(model, (x,), platforms=("cpu", "cuda"))
    assert "stablehlo.custom_call @mosaic_gpu" in artifact.stablehlo_text  # in the CUDA branch's function
    torch.testing.assert_close(artifact(x), model(x), **TOLERANCE)


def test_bad_platforms_are_refused_before_the_export():
    model, x = _model(), torch.randn(2, 8)
    for platforms, message in ((("cpu", "gpu"), "unknown 'gpu'; each is one of"), (("cpu", "cpu"), "named twice"),
                               ("cpu", "a non-empty sequence of platform names"), ((), "a non-empty sequence")):
        with pytest.raises(ValueError, match=message):
            export_to_stablehlo(model, (x,), platforms=platforms)
    with pytest.raises(ValueError, match="platform= \\(one\\) or platforms= \\(several\\), not both"):
        export_to_stablehlo(model, (x,), platform="cpu", platforms=("cpu", "cuda"))
    with pytest.raises(ValueError, match="unknown 'gpu'"):
        export_to_stablehlo(model, (x,), platform="gpu")


def test_a_platform_without_a_lowering_is_named():
    model, x = _model(), torch.randn(2, 8)
    with exporter.scoped_lowering(OP, doubled_softsign, platform="cuda"):
        with pytest.raises(LoweringError, match=r"no lowering for kx\.softsign_scale\.default on cpu \(one is "
                                                r"registered for other platforms only\)"):
            export_to_stablehlo(model, (x,), platforms=("cpu", "cuda"))


def test_a_lowering_for_every_platform_is_emitted_once():
    model, x = _model(), torch.randn(2, 8)
    with exporter.scoped_lowering(OP, softsign):
        artifact = export_to_stablehlo(model, (x,), platforms=("cpu", "cuda"))
    assert len(re.findall(r"func\.func private @jax_user_kx_softsign_scale", artifact.stablehlo_text)) == 1
    assert "stablehlo.case" not in artifact.stablehlo_text  # JAX lowers it alike for both: shared
    torch.testing.assert_close(artifact(x), model(x), **TOLERANCE)


def test_a_per_platform_lowering_inside_a_composite_is_refused_by_name():
    model, x = _model(), torch.randn(2, 8)
    model.forward = exporter.composite(model.forward, name="kx.block")
    with exporter.scoped_lowering(OP, softsign), exporter.scoped_lowering(OP, doubled_softsign, platform="cuda"):
        with pytest.raises(LoweringError, match=r"kx\.softsign_scale\.default.*differs between the platforms cpu, "
                                                r"cuda.*cannot read @main's platform index"):
            export_to_stablehlo(model, (x,), platforms=("cpu", "cuda"))


def test_a_bundle_whose_manifest_predates_platforms_still_loads(tmp_path):
    torch.manual_seed(0)
    model, x = torch.nn.Linear(8, 4).eval(), torch.randn(2, 8)
    path = export_to_stablehlo(model, (x,)).save(tmp_path / "old")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["signature"].pop("platforms") == ["cpu"]
    (path / "manifest.json").write_text(json.dumps(manifest))
    loaded = load_artifact(path)
    assert loaded.platforms == ("cpu",)
    torch.testing.assert_close(loaded(x), model(x), **TOLERANCE)


CASE = """
func.func public @main(%index: tensor<i32>) -> tensor<f32> {
  %0 = "stablehlo.case"(%index) ({
    %c = stablehlo.constant dense<10.0> : tensor<f32>
    stablehlo.return %c : tensor<f32>
  }, {
    %c = stablehlo.constant dense<20.0> : tensor<f32>
    stablehlo.return %c : tensor<f32>
  }, {
    %c = stablehlo.constant dense<30.0> : tensor<f32>
    stablehlo.return %c : tensor<f32>
  }) : (tensor<i32>) -> tensor<f32>
  return %0 : tensor<f32>
}
"""


def test_a_case_as_a_chain_of_ifs_picks_the_same_branches():
    """The dynamic XLA handoffs' form (TF refines functions called in ifs, not in cases): an index out of range
    runs the last branch, as the case does."""
    with make_context():
        text = cases_as_ifs(ir.Module.parse(CASE)).operation.get_asm()
    assert "stablehlo.case" not in text and text.count("stablehlo.if") == 2
    executable = pjrt.Executable(text)
    got = [float(executable.execute(pjrt.put([np.int32(i)]))[0]) for i in (0, 1, 2, 7)]
    assert got == [10.0, 20.0, 30.0, 30.0]
