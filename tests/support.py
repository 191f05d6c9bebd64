"""Shared test helpers: export a module or function, run it on PJRT, compare with eager torch."""
from __future__ import annotations

import torch

from exporter import export_to_stablehlo


class FunctionModule(torch.nn.Module):
    """Wraps a plain function so torch.export can take it."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def assert_matches_eager(model, *args, kwargs=None, atol=None, rtol=None, dynamic_shapes=None):
    """Export, convert, run on PJRT and compare with eager.

    Tolerances default to ``torch.testing.assert_close``'s own per-dtype values;
    a test that passes looser ones must say why next to the call.
    """
    if not isinstance(model, torch.nn.Module):
        model = FunctionModule(model)
    model = model.eval()
    kwargs = kwargs or {}
    with torch.no_grad():
        expected = model(*args, **kwargs)
    artifact = export_to_stablehlo(model, args, kwargs, dynamic_shapes=dynamic_shapes)
    actual = artifact(*args, **kwargs)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=True)
    return artifact
