"""``torch._native_multi_head_attention`` (``nn.MultiheadAttention``'s inference fast path, which torch.export keeps
when a program calls it): lowered through its ATen form, against eager with and without masks and weights."""
import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo

from ..support import make

EMBED, HEADS = 8, 2


class NativeAttention(torch.nn.Module):
    def __init__(self, need_weights, average, mask_type):
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(EMBED, HEADS, batch_first=True)
        self.need_weights, self.average, self.mask_type = need_weights, average, mask_type

    def forward(self, query, key, mask):
        m = self.mha
        return torch._native_multi_head_attention(
            query, key, key, EMBED, HEADS, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias,
            mask if self.mask_type is not None else None, self.need_weights, self.average, self.mask_type)


@pytest.mark.parametrize("need_weights, average, mask_type", [(False, True, None), (True, True, 1),
                                                              (True, False, 0)])
def test_native_multi_head_attention(need_weights, average, mask_type):
    query, key = make((2, 5, EMBED)), make((2, 5, EMBED), seed=1)  # the op needs one shape for all three
    mask = torch.zeros((2, 5) if mask_type == 1 else (5, 5), dtype=torch.bool)
    mask[1, 2 if mask_type == 1 else 3:] = True  # a key padding mask, or an attention mask
    model = NativeAttention(need_weights, average, mask_type).eval()
    with torch.no_grad():
        ep = torch.export.export(model, (query, key, mask))
        expected = ep.module()(query, key, mask)
    assert any("multi_head" in str(n.target) for n in ep.graph.nodes)
    actual = export_to_stablehlo(ep)(query, key, mask)
    if not need_weights:  # eager's undefined weights come back as None; the program's meta says an empty tensor
        assert expected[1] is None and actual[1].numel() == 0
        actual, expected = actual[0], expected[0]
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)  # products in another order than torch's


def test_native_multi_head_attention_of_a_dynamic_batch():
    """Symbolic sizes: the ATen form is traced on the node's own fakes, so its sizes are the program's."""
    model = NativeAttention(True, True, None).eval()
    batch = torch.export.Dim("batch", max=64)
    with torch.no_grad():
        ep = torch.export.export(model, (make((2, 5, EMBED)), make((2, 5, EMBED), seed=1), None),
                                 dynamic_shapes=({0: batch}, {0: batch}, None))
    artifact = export_to_stablehlo(ep)
    for size in (3, 7):
        query, key = make((size, 5, EMBED), seed=size), make((size, 5, EMBED), seed=size + 1)
        with torch.no_grad():
            expected = ep.module()(query, key, None)
        torch.testing.assert_close(artifact(query, key, None), expected, atol=1e-5, rtol=1e-4)
