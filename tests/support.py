"""Shared test helpers: export a module or function, run it on PJRT, compare with eager torch; deterministic
inputs; checks that ops were lowered by their own rules and that symbolic sizes lower to dynamic ops."""
from __future__ import annotations

import re

import torch
from jaxlib.mlir import ir

from torch_stablehlo.aten_lowerings.mlir_types import mlir_shape
from torch_stablehlo.aten_lowerings.registry import lowering_for
from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.stablehlo_ir.mlir_context import make_context

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64]


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


# -- inputs ------------------------------------------------------------------------------------------------

def make(shape, dtype=torch.float32, low=-3.0, high=3.0, seed=0, *, normal=False):
    """Deterministic inputs from ``seed``: floats uniform in [low, high) (standard normal if ``normal``),
    ints uniform in [low, high), random bools."""
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if dtype.is_floating_point:
        if normal:
            return torch.randn(shape, generator=generator).to(dtype)
        return (torch.rand(shape, generator=generator) * (high - low) + low).to(dtype)
    return torch.randint(int(low), int(high), shape, generator=generator, dtype=dtype)


def randn(*shape, dtype=torch.float32, mean=0.0, std=1.0):
    """Normal samples from torch's global generator, drawn in float32, then cast to ``dtype``."""
    return (torch.randn(*shape) * std + mean).to(dtype)


# -- lowered by their own rules ------------------------------------------------------------------------------

def table(ops: dict):
    """A function applying each ``name: (overload, function)`` of ``ops`` to the same inputs."""
    return lambda *args: {name: function(*args) for name, (_, function) in ops.items()}


def assert_lowers(ops, function, *args, **tolerances):
    """The converted program matches eager, and each overload in ``ops`` was lowered by its own rule: its name
    is on a location in the StableHLO (a decomposition would have left only the names of the ops it calls)."""
    assert_named_in_locations(ops, assert_matches_eager(function, *args, **tolerances).stablehlo_text)


def assert_table_lowers(ops: dict, *args, **tolerances):
    """``assert_lowers`` for a ``table`` of ops."""
    assert_lowers({op for op, _ in ops.values()}, table(ops), *args, **tolerances)


def assert_named_in_locations(ops, stablehlo_text: str):
    """Each overload in ``ops`` names a location in ``stablehlo_text``."""
    missing = [str(op) for op in ops if not re.search(rf'["/]{re.escape(str(op))}"', stablehlo_text)]
    assert not missing, f"not lowered by their own rules: {missing}"


def assert_registered_and_exported(ops, function, *args):
    """For rules that may emit no op (identities): ``function`` exports to calls of each of ``ops``, which have
    rules, so that no decomposition stands in for them."""
    targets = {node.target for node in torch.export.export(FunctionModule(function), args).graph.nodes}
    for op in ops:
        assert op in targets, f"{op} is not in the exported graph: {sorted(map(str, targets))}"
        assert lowering_for(op) is not None, f"no lowering registered for {op}"


# -- symbolic sizes ------------------------------------------------------------------------------------------

def export_with_symbolic_batch(function, x, *rest, min_batch=3, max_batch=64):
    """torch.export ``function`` on ``(x, *rest)`` with dim 0 of ``x`` symbolic and ``rest`` static."""
    batch = torch.export.Dim("batch", min=min_batch, max=max_batch)
    # FunctionModule.forward takes ``*args``, so the inputs' specs sit one tuple deeper.
    dynamic_shapes = (({0: batch},) + (None,) * len(rest),)
    return torch.export.export(FunctionModule(function), (x, *rest), dynamic_shapes=dynamic_shapes)


def assert_lowers_with_symbolic_batch(function, x, *rest, reads_size=True) -> str:
    """Lower ``function`` with dim 0 of ``x`` symbolic; return the StableHLO text.

    @main's results must have torch's sizes (``?`` where symbolic), and the text must read a size at run time
    (``get_dimension_size``) if ``reads_size``, or must not if it is False. Numerics are not compared here
    (tests/runtime/test_dynamic.py runs dynamic artifacts at several sizes).
    """
    program = export_with_symbolic_batch(function, x, *rest)
    text = export_to_stablehlo(program).stablehlo_text
    with make_context():
        module = ir.Module.parse(text)  # held: an operation of a freed module is freed memory
        main = module.body.operations[0]
        results = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value).results
        actual = [list(ir.RankedTensorType(r).shape) for r in results]
        outputs = [node for node in program.graph.nodes if node.op == "output"][0].args[0]
        assert actual == [mlir_shape(node.meta["val"].shape) for node in outputs]
    reads = "get_dimension_size" in text
    assert reads == reads_size, f"get_dimension_size {'found in' if reads else 'missing from'} the StableHLO"
    return text


# -- prompts ------------------------------------------------------------------------------------------------------

def left_padded_prompts(lengths, vocab: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts of ``lengths`` tokens (ids from 3 up), left-padded with 0 to the longest:
    ``(input_ids, attention_mask)``."""
    torch.manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), width))
    mask = (torch.arange(width) >= width - torch.tensor(lengths).unsqueeze(1)).to(torch.int64)
    return ids.masked_fill(mask == 0, 0), mask
