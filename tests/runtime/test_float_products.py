"""``stablehlo_ir.float_products``: on CPU, a small float32 weight times one row is compiled through the weight's
transpose (the form XLA splits over its threads); larger products, several rows and other platforms keep torch's
form, and the numbers are torch's."""
import torch

from torch_stablehlo import export_to_stablehlo
from torch_stablehlo.stablehlo_ir.float_products import SMALL_WEIGHT_BYTES
from torch_stablehlo.stablehlo_ir.passes import prepare_for_xla


def _decoder_step(width: int, rows: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.SiLU(), torch.nn.Linear(width, 8)).eval()
    x = torch.randn(rows, 1, width)
    return model, x, export_to_stablehlo(model, (x,))


def test_one_row_times_a_small_weight_reads_the_transpose():
    model, x, artifact = _decoder_step(256, rows=1)
    text = prepare_for_xla(artifact.stablehlo_text)
    assert text.count("stablehlo.transpose") == 2 and text.count("stablehlo.optimization_barrier") == 2, text
    assert text.count("contracting_dims = [2] x [0]") == 2, text
    torch.testing.assert_close(artifact(x), model(x), rtol=1e-5, atol=1e-6)


def test_several_rows_large_weights_and_other_platforms_keep_torchs_form():
    for rows, width in ((3, 256), (1, int((SMALL_WEIGHT_BYTES / 4) ** 0.5) + 1)):
        model, x, artifact = _decoder_step(width, rows)
        text = prepare_for_xla(artifact.stablehlo_text)
        assert text.count("stablehlo.transpose") == (0 if rows > 1 else 1), (rows, width)  # the 8-wide head
        torch.testing.assert_close(artifact(x), model(x), rtol=1e-4, atol=1e-5)
    assert prepare_for_xla(artifact.stablehlo_text, platform="cuda") is artifact.stablehlo_text
