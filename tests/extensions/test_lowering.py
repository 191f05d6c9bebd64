"""A user's ``torch.library`` op lowered by a JAX function (``exporter.lowering``): static and dynamic, through the
artifact, a bundle loaded in a process that never registered the function, the SavedModel and ``to_jax()``;
arguments of every kind; results checked against the op's fake; scoped and per-platform registrations."""
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch.export import Dim

from torch_stablehlo import exporter
from torch_stablehlo.exporter import LoweringError, UnsupportedOpsError, export_to_stablehlo
from torch_stablehlo.tools.inspection import bundle_report, format_report
from tests.extensions.ops import Rms, Stats, doubled_by_pallas

TOLERANCE = dict(rtol=1e-5, atol=1e-5)  # float32: the same formula, JAX's reductions against torch's


@exporter.lowering(torch.ops.kx.scaled_rms.default)
def scaled_rms(x, w, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


@exporter.lowering(torch.ops.kx.gather_stats.default)
def gather_stats(xs, bias, n, index):
    assert bias is None and isinstance(xs, list)
    total = xs[0] + xs[1]
    return (jnp.take(total, index, axis=0),), total.sum(-1) * n  # a pytree: its leaves are the op's results


def _rms_example():
    torch.manual_seed(0)
    return Rms().eval(), torch.randn(3, 8)


@pytest.fixture(scope="module")
def dynamic_rms():
    model, x = _rms_example()
    artifact = export_to_stablehlo(model, (x,), dynamic_shapes=({0: Dim("batch", min=2, max=16)},))
    return model, artifact


def test_a_library_op_lowered_by_jax_equals_eager():
    model, x = _rms_example()
    artifact = export_to_stablehlo(model, (x,))
    assert "func.func private @jax_user_kx_scaled_rms_default_" in artifact.stablehlo_text
    assert "custom_call" not in artifact.stablehlo_text
    torch.testing.assert_close(artifact(x), model(x), **TOLERANCE)


def test_a_library_op_under_a_dynamic_batch(dynamic_rms):
    model, artifact = dynamic_rms
    assert "tensor<?x8xf32>" in artifact.stablehlo_text
    for batch in (2, 7, 16):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(artifact(x), model(x), **TOLERANCE)


FRESH_PROCESS = """
import json, sys, torch
from torch_stablehlo import load_artifact
path, x = sys.argv[1], torch.tensor(json.loads(sys.argv[2]))
assert not hasattr(torch.ops.kx, "scaled_rms")  # neither the op nor its lowering exists in this process
print(json.dumps(load_artifact(path)(x).tolist()))
"""


def test_a_bundle_runs_in_a_process_that_never_registered_the_lowering(dynamic_rms, tmp_path):
    model, artifact = dynamic_rms
    path = artifact.save(tmp_path / "rms")
    x = torch.randn(5, 8)
    run = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(path), json.dumps(x.tolist())], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    torch.testing.assert_close(torch.tensor(json.loads(run.stdout)), model(x), **TOLERANCE)
    report = bundle_report(path)
    assert report["user_lowerings"] == {"kx_scaled_rms_default": 1} and report["composites"] == {}
    assert "user JAX lowerings (functions):\n       1  kx_scaled_rms_default" in format_report(report)


def test_the_saved_model_and_to_jax_run_the_lowering(dynamic_rms, tmp_path):
    tf = pytest.importorskip("tensorflow")
    model, artifact = dynamic_rms
    x = torch.randn(4, 8)
    signature = tf.saved_model.load(str(artifact.save_tf_saved_model(tmp_path / "tf"))).signatures["serving_default"]
    (served,) = signature(x=tf.constant(x.numpy())).values()
    np.testing.assert_allclose(served.numpy(), model(x).detach().numpy(), **TOLERANCE)
    jax_model = artifact.to_jax()
    np.testing.assert_allclose(np.asarray(jax_model(x.numpy())), model(x).detach().numpy(), **TOLERANCE)


def test_lists_optionals_sizes_int64_and_several_outputs_under_a_dynamic_batch():
    torch.manual_seed(0)
    a, b = torch.randn(4, 6), torch.randn(4, 6)
    index = torch.tensor([3, 0, 3], dtype=torch.int64)
    batch = Dim("batch", min=2, max=32)
    artifact = export_to_stablehlo(Stats(), (a, b, index), dynamic_shapes=({0: batch}, {0: batch}, None))
    assert "tensor<3xi64>" in artifact.stablehlo_text  # int64 indices keep 64 bits
    for size in (4, 9):
        a, b = torch.randn(size, 6), torch.randn(size, 6)
        index = torch.tensor([size - 1, 0, 2], dtype=torch.int64)
        rows, sums = artifact(a, b, index)
        want_rows, want_sums = Stats()(a, b, index)
        torch.testing.assert_close(rows, want_rows, **TOLERANCE)
        torch.testing.assert_close(sums, want_sums, **TOLERANCE)  # times n: the call's batch size, not the example's


def test_a_result_that_disagrees_with_the_fake_raises_naming_the_op():
    model, x = _rms_example()
    with exporter.scoped_lowering(torch.ops.kx.scaled_rms.default, lambda x, w, eps: x[:, :4]):
        with pytest.raises(LoweringError, match=r"kx\.scaled_rms\.default.*returned tensor<3x4xf32>.*fake says "
                                                r"tensor<3x8xf32>"):
            export_to_stablehlo(model, (x,))
    with exporter.scoped_lowering(torch.ops.kx.scaled_rms.default, lambda x, w, eps: x.astype(jnp.float16)):
        with pytest.raises(LoweringError, match=r"kx\.scaled_rms\.default.*tensor<3x8xf16>"):
            export_to_stablehlo(model, (x,))


def test_a_scoped_lowering_wins_over_the_global_one_inside_its_block_only():
    model, x = _rms_example()
    with exporter.scoped_lowering(torch.ops.kx.scaled_rms.default, lambda x, w, eps: x * 0 + 3):
        torch.testing.assert_close(export_to_stablehlo(model, (x,))(x), torch.full((3, 8), 6.0))
    torch.testing.assert_close(export_to_stablehlo(model, (x,))(x), model(x), **TOLERANCE)


def test_an_aten_op_overridden_in_a_scope():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    x = torch.randn(2, 4)
    with exporter.scoped_lowering(torch.ops.aten.relu.default, lambda x: jnp.abs(x)):
        artifact = export_to_stablehlo(model, (x,))
    torch.testing.assert_close(artifact(x), model[0](x).abs(), **TOLERANCE)


def test_the_export_platforms_variant_wins_over_the_default():
    model, x = _rms_example()
    with exporter.scoped_lowering(torch.ops.kx.scaled_rms.default, lambda x, w, eps: x * 0 + 1), \
            exporter.scoped_lowering(torch.ops.kx.scaled_rms.default, lambda x, w, eps: x * 0 + 5, platform="cpu"), \
            exporter.scoped_lowering(torch.ops.kx.scaled_rms.default, lambda x, w, eps: x * 0 + 7, platform="cuda"):
        torch.testing.assert_close(export_to_stablehlo(model, (x,))(x), torch.full((3, 8), 10.0))


def test_a_pallas_kernel_registered_for_cuda_is_lowered_for_cuda_exports_only():
    torch.manual_seed(0)
    model, x = Rms(128).eval(), torch.randn(8, 128)  # Mosaic GPU copies whole warpgroups (128 bytes)
    with exporter.scoped_lowering(torch.ops.kx.scaled_rms.default, lambda x, w, eps: doubled_by_pallas(x),
                                  platform="cuda"):
        cuda = export_to_stablehlo(model, (x,), platform="cuda")
        cpu = export_to_stablehlo(model, (x,))
    assert "stablehlo.custom_call @mosaic_gpu" in cuda.stablehlo_text  # Pallas' GPU kernel
    assert "custom_call" not in cpu.stablehlo_text  # the global (default) lowering on CPU
    torch.testing.assert_close(cpu(x), model(x), **TOLERANCE)


def test_a_missing_lowering_is_an_unsupported_op_naming_it():
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.ops.kx.unlowered(x) + 1

    with pytest.raises(UnsupportedOpsError, match=r"kx\.unlowered\.default"):
        export_to_stablehlo(Model(), (torch.randn(2),))


def test_an_op_that_writes_its_arguments_is_lowered_where_torch_functionalised_it():
    """kx.scale_ writes x (auto_functionalized_v2 in the program): its lowering returns x's new value, which the
    artifact writes back into the caller's x as ep.module() does."""
    class Model(torch.nn.Module):
        def forward(self, x, y):
            torch.ops.kx.scale_(x, 3.0)
            return x + y

    with exporter.scoped_lowering(torch.ops.kx.scale_.default, lambda x, factor: x * factor):
        artifact = export_to_stablehlo(torch.export.export(Model(), (torch.randn(4), torch.randn(4))))
    x, y = torch.randn(4), torch.randn(4)
    written, expected = x.clone(), Model()(x.clone(), y)
    torch.testing.assert_close(artifact(written, y), expected, **TOLERANCE)
    torch.testing.assert_close(written, x * 3, **TOLERANCE)


def test_bad_registrations_are_refused_before_anything_runs():
    with pytest.raises(TypeError, match="overload packet: name one overload, e.g. .default"):
        exporter.lowering(torch.ops.kx.scaled_rms)
    with pytest.raises(ValueError, match="platform='gpu'"):
        exporter.lowering(torch.ops.kx.scaled_rms.default, platform="gpu")
