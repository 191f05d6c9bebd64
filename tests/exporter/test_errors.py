"""Bad programs and bad inputs get one clear error that says what was wrong and what would be right."""
import inspect

import numpy as np
import pytest
import torch

from torch_stablehlo.aten_lowerings.registry import LOWERINGS
from torch_stablehlo.exporter import InputError, UnsupportedOpsError, export_to_stablehlo
from tests.support import assert_matches_eager


@torch.library.custom_op("stablehlo_tests::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("stablehlo_tests::enigma", mutates_args=())
def enigma(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@enigma.register_fake
def _(x):
    return torch.empty_like(x)


class Puzzling(torch.nn.Module):
    def forward(self, x):
        y = mystery(x)
        y = mystery(y) + enigma(y)
        return mystery(y)


def test_unsupported_ops_are_all_listed_with_count_and_first_source_line():
    with pytest.raises(UnsupportedOpsError) as raised:
        export_to_stablehlo(Puzzling(), (torch.randn(2),))
    message = str(raised.value)
    lines, first = inspect.getsourcelines(Puzzling.forward)
    assert "2 op(s)" in message
    assert f"stablehlo_tests.mystery.default  (x3), first at top-level module, {__file__}:{first + 1}" in message
    assert f"stablehlo_tests.enigma.default  (x1), first at top-level module, {__file__}:{first + 2}" in message
    assert set(raised.value.unsupported) == {"stablehlo_tests.mystery.default", "stablehlo_tests.enigma.default"}


def test_op_without_lowering_is_decomposed(monkeypatch):
    """silu has a torch decomposition: with its rule removed, the program is decomposed and still matches."""
    monkeypatch.delitem(LOWERINGS, torch.ops.aten.silu.default, raising=False)
    artifact = assert_matches_eager(torch.nn.SiLU(), torch.randn(4, 5))
    assert "aten.silu" not in artifact.stablehlo_text


def _mlp_artifact():
    return export_to_stablehlo(torch.nn.Linear(4, 2).eval(), (torch.randn(3, 4),))


def test_wrong_input_count():
    with pytest.raises(InputError, match=r"expected\s"):
        _mlp_artifact()(torch.randn(3, 4), torch.randn(3, 4))


def test_wrong_dtype_names_input_and_expected_dtype():
    with pytest.raises(InputError, match=r"input 'input': expected dtype float32, got float64"):
        _mlp_artifact()(torch.randn(3, 4, dtype=torch.float64))


def test_wrong_shape_names_input_and_expected_shape():
    with pytest.raises(InputError, match=r"input 'input': expected shape \[3, 4\], got \[3, 5\]"):
        _mlp_artifact()(torch.randn(3, 5))


def test_non_tensor_where_tensor_expected():
    with pytest.raises(InputError, match=r"input 'input': expected a torch.Tensor"):
        _mlp_artifact()(np.ones((3, 4), dtype=np.float32))


def test_unknown_and_missing_keywords():
    class Keyed(torch.nn.Module):
        def forward(self, x, *, mask):
            return x * mask

    artifact = export_to_stablehlo(Keyed(), (torch.randn(2),), {"mask": torch.ones(2)})
    with pytest.raises(InputError, match=r"unexpected \['mask2'\]; missing \['mask'\]"):
        artifact(torch.randn(2), mask2=torch.ones(2))


def test_not_a_model():
    with pytest.raises(TypeError, match="torch.nn.Module or a torch.export.ExportedProgram"):
        export_to_stablehlo(lambda x: x, (torch.randn(2),))
