"""The control-flow zoo entries beyond what every zoo model goes through (tests/golden/test_zoo.py and
test_serving.py): ``scan_layers`` keeps the loop's numerics and the module's size flat in depth."""
import pytest
import torch
from torch import nn

from torch_stablehlo.exporter import export_to_stablehlo, scan_layers
from torch_stablehlo.golden.control_flow_zoo import decoder
from torch_stablehlo.stablehlo_ir.op_counts import count_ops


def test_scan_layers_matches_the_python_loop_in_eager():
    scanned = decoder(layers=3, scanned=True)
    unrolled = decoder(layers=3, scanned=False)
    with torch.no_grad():
        torch.testing.assert_close(scanned.model(*scanned.args), unrolled.model(*unrolled.args), rtol=0, atol=0)


def test_scanned_decoders_of_4_and_32_layers_differ_by_a_few_ops():
    counts = {}
    for layers in (4, 32):
        built = decoder(layers=layers)
        artifact = export_to_stablehlo(built.model, built.args)
        counts[layers] = count_ops(artifact.stablehlo_text)
        assert artifact.stablehlo_text.count("stablehlo.while") == 1
    assert abs(counts[32] - counts[4]) <= 4, counts


def test_layers_that_differ_are_refused():
    with pytest.raises(ValueError, match="identical layers: layer 1"):
        scan_layers(nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 5)]), torch.randn(2, 4))
