"""Stacks of weights become one @main weight (``exporter.conversion.weight_stacks``), as ``scan_layers`` needs."""
import torch
from torch import nn

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.exporter.conversion.weight_stacks import fold_weight_stacks


class Stacked(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        weights = torch.stack([layer.weight for layer in self.layers])
        return (x @ weights).sum(0) + self.layers[0].bias  # one bias is used apart from any stack


def test_a_stack_of_weights_becomes_one_constant_and_the_program_is_not_changed():
    model, x = Stacked().eval(), torch.randn(2, 4)
    program = torch.export.export(model, (x,))
    folded = fold_weight_stacks(program)
    targets = [spec.target for spec in folded.graph_signature.input_specs]
    assert targets == ["layers.0.bias", "layers.1.bias", "layers.2.bias", "layers.0.weight:stack3", None]
    assert len(program.graph_signature.input_specs) == 7, "the given program is left as it was"
    torch.testing.assert_close(folded.constants["layers.0.weight:stack3"],
                               torch.stack([layer.weight.detach() for layer in model.layers]))
    artifact = export_to_stablehlo(program)
    assert [slot.name for slot in artifact.signature.weights] == targets[:-1]
    torch.testing.assert_close(artifact(x), model(x))
