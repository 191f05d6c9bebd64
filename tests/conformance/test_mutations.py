"""Every mutation torch.export records is carried out as ``ep.module()`` carries it: user inputs a graph op writes
(``native_batch_norm`` in training updates the running statistics it is given, though its schema does not mark
them written), and parameters written under ``no_grad`` (``PARAMETER_MUTATION``), carried from call to call."""
import copy

import torch

from torch_stablehlo.exporter import export_to_stablehlo

from ..support import make


class BatchNormOp(torch.nn.Module):
    """torch's test_run_decomposition_supports_user_input_mutation."""

    def forward(self, input, weight, bias, running_mean, running_var, training, momentum, eps):
        return torch.ops.aten.native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


def test_batch_norm_in_training_updates_user_input_statistics():
    args = (make((5, 5, 5), seed=1), make(5, seed=2), make(5, seed=3), make(5, seed=4), make(5, low=0.5, seed=5),
            True, 0.5, 0.6)
    ep = torch.export.export(BatchNormOp(), args)
    artifact = export_to_stablehlo(ep)
    expected_args, actual_args = copy.deepcopy(args), copy.deepcopy(args)
    torch.testing.assert_close(artifact(*actual_args), ep.module()(*expected_args))
    assert not torch.equal(expected_args[3], args[3])  # eager wrote them: 0.5 * old + 0.5 * the batch's
    torch.testing.assert_close(actual_args[3], expected_args[3])
    torch.testing.assert_close(actual_args[4], expected_args[4])


class NoGradParameterWrite(torch.nn.Module):
    """torch's test_no_grad_param_inplace."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        with torch.no_grad():
            self.weight.mul_(2)
        return x + self.weight


def test_parameter_written_under_no_grad_is_carried_between_calls():
    ep = torch.export.export(NoGradParameterWrite(), (torch.ones(3),))
    artifact = export_to_stablehlo(ep)
    module = ep.module()
    for step in range(3):
        x = make(3, seed=step)
        torch.testing.assert_close(artifact(x), module(x).detach())
