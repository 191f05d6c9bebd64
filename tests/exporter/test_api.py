"""The public API: pytrees and kwargs both ways, weights as arguments, locations, save/load."""
import collections
import json
import inspect
import re
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from transformers import GPT2Config, GPT2LMHeadModel

from torch_stablehlo.exporter import InputError, export_to_stablehlo, load_artifact
from tests.exporter.models import Counter
from tests.support import assert_matches_eager


class TwoHeads(torch.nn.Module):
    """Nested inputs (tuple + kwargs) and a dict/list output."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)
        self.register_buffer("offset", torch.arange(3, dtype=torch.float32))

    def forward(self, pair, *, scale, extra=None):
        a, b = pair
        hidden = torch.relu(self.proj(a)) + self.offset
        return {"sum": hidden * scale, "parts": [hidden - b, b * 2]}


def _inputs():
    torch.manual_seed(0)
    return (torch.randn(2, 4), torch.randn(2, 3)), torch.randn(2, 3)


def test_nested_inputs_kwargs_and_outputs_match_eager():
    pair, scale = _inputs()
    assert_matches_eager(TwoHeads(), pair, kwargs={"scale": scale})


class Scaled(torch.nn.Module):
    def forward(self, x, y, *, scale):
        return x * 2 + y * scale


def test_positional_inputs_may_be_passed_by_name():
    """As a Python call binds them: ``art(x=..., y=...)`` for ``forward(self, x, y)``; one left out is refused."""
    x, y, scale = torch.ones(2), torch.arange(2.0), torch.tensor(3.0)
    art = export_to_stablehlo(Scaled(), (x, y), {"scale": scale})
    expected = Scaled()(x, y, scale=scale)
    for args, kwargs in [((x, y), {}), ((), {"x": x, "y": y}), ((x,), {"y": y})]:
        torch.testing.assert_close(art(*args, **kwargs, scale=scale), expected, rtol=0, atol=0)
    with pytest.raises(InputError, match="expected 2 positional input"):
        art(x, scale=scale)


def test_weights_are_arguments_of_main_not_constants():
    pair, scale = _inputs()
    artifact = export_to_stablehlo(TwoHeads().eval(), (pair,), {"scale": scale})
    header = re.search(r"func\.func public @main\((.*?)\) ->", artifact.stablehlo_text).group(1)
    names = re.findall(r'loc\("([^"]+)"\)', header)
    assert names == ["proj.weight", "proj.bias", "offset", "pair_0", "pair_1", "scale"]
    assert [s.kind for s in artifact.signature.inputs[:3]] == ["parameter", "parameter", "buffer"]
    assert "dense<" not in artifact.stablehlo_text.split("->")[1].split("stablehlo.constant")[0]


def test_every_op_carries_module_path_and_source_line():
    pair, scale = _inputs()
    text = export_to_stablehlo(TwoHeads().eval(), (pair,), {"scale": scale}).stablehlo_text
    assert re.search(r'#loc\d+ = loc\("proj/aten\.linear\.default"\(#loc\d+\)\)', text)
    lines, first = inspect.getsourcelines(TwoHeads.forward)
    proj_line = first + next(i for i, line in enumerate(lines) if "self.proj(a)" in line)
    assert re.search(rf'loc\(".*test_api\.py":{proj_line}:0\)', text), "the model's own forward line"
    body = text.split("func.func")[1].split("\n}")[0]
    for line in body.splitlines():
        if "stablehlo." in line:
            assert "loc(#loc" in line and "loc(unknown)" not in line, line


def test_exported_program_input_and_signature():
    pair, scale = _inputs()
    program = torch.export.export(TwoHeads().eval(), (pair,), {"scale": scale})
    artifact = export_to_stablehlo(program)
    user = artifact.signature.user_inputs
    assert [(s.tensor.name, s.tensor.dtype, s.tensor.shape) for s in user] == [
        ("pair_0", "float32", (2, 4)), ("pair_1", "float32", (2, 3)), ("scale", "float32", (2, 3))]
    assert [s.tensor.shape for s in artifact.signature.user_outputs] == [(2, 3)] * 3


def test_save_load_round_trip_keeps_structure(tmp_path):
    pair, scale = _inputs()
    model = TwoHeads().eval()
    artifact = export_to_stablehlo(model, (pair,), {"scale": scale})
    loaded = load_artifact(artifact.save(tmp_path / "bundle"))
    torch.testing.assert_close(loaded(pair, scale=scale), model(pair, scale=scale))
    assert "proj/aten.linear.default" in loaded.stablehlo_text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging folder left behind"


def test_buffer_mutation_carries_state_between_calls():
    artifact = export_to_stablehlo(Counter(), (torch.ones(3),))
    eager = Counter()
    for step in range(3):
        x = torch.full((3,), float(step + 1))
        torch.testing.assert_close(artifact(x), eager(x))
    torch.testing.assert_close(artifact.state["total"], eager.total)
    assert [s.name for s in artifact.signature.state] == ["total"] and not artifact.signature.weights
    torch.testing.assert_close(artifact.reset_state().state["total"], torch.zeros(3))
    torch.testing.assert_close(artifact(torch.ones(3)), torch.full((3,), 2.0))


def test_tied_weights_save(tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4, bias=False)
            self.b = torch.nn.Linear(4, 4, bias=False)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    model, x = Tied().eval(), torch.randn(2, 4)
    bundle = export_to_stablehlo(model, (x,)).save(tmp_path / "tied")
    with safe_open(bundle / "weights.safetensors", "pt") as stored:
        assert list(stored.keys()) == ["a.weight"], "a tied weight is stored once"
    loaded = load_artifact(bundle)
    torch.testing.assert_close(loaded(x), model(x))
    assert loaded.weights["b.weight"] is loaded.weights["a.weight"]


def test_save_never_replaces_a_folder_that_is_not_an_artifact(tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not an artifact folder"):
        export_to_stablehlo(torch.nn.ReLU(), (torch.randn(2),)).save(precious)
    assert (precious / "notes.txt").read_text() == "keep me"


def test_loaded_in_a_fresh_process_returns_the_models_own_output_type(tmp_path):
    """The out_spec names transformers' ModelOutput class; loading must not need the caller to import it."""
    config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16, use_cache=False)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    tokens = torch.randint(0, 50, (1, 5))
    bundle = export_to_stablehlo(model, (tokens,)).save(tmp_path / "gpt2")
    torch.save({"tokens": tokens, "logits": model(tokens).logits.detach()}, tmp_path / "io.pt")
    script = (
        "import sys, torch\n"
        "from torch_stablehlo.exporter import load_artifact\n"
        f"io = torch.load({str(tmp_path / 'io.pt')!r})\n"
        f"out = load_artifact({str(bundle)!r})(io['tokens'])\n"
        "assert 'transformers' not in sys.modules or type(out).__name__ == 'CausalLMOutputWithCrossAttentions'\n"
        "torch.testing.assert_close(out.logits, io['logits'])\n"
        "print(type(out).__name__)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "CausalLMOutputWithCrossAttentions"


class MaxAndPair(torch.nn.Module):
    """Returns torch.return_types.max and a namedtuple: types torch's pytree cannot serialise."""

    Pair = collections.namedtuple("Pair", "low high")

    def forward(self, x):
        return x.max(dim=1), self.Pair(x.min(), x.amax())


def test_unserialisable_tuple_types_round_trip_as_tuples(tmp_path):
    model, x = MaxAndPair(), torch.randn(3, 4)
    artifact = export_to_stablehlo(model, (x,))
    in_process = artifact(x)
    assert type(in_process[0]).__name__ == "max" and type(in_process[1]) is MaxAndPair.Pair
    torch.testing.assert_close(tuple(in_process[0]), tuple(model(x)[0]))
    loaded = load_artifact(artifact.save(tmp_path / "maxpair"))(x)
    assert type(loaded[0]) is tuple and type(loaded[1]) is tuple
    torch.testing.assert_close(loaded, tuple(tuple(part) for part in model(x)))


# -- in-place updates of inputs, scalar and constant outputs ---------------------------------------

class UpdatesRunningStats(torch.nn.Module):
    """Batch norm in training mode on running stats passed as inputs, and an in-place add on another input."""

    def forward(self, x, mean, var, counter):
        counter.add_(1)
        return torch.nn.functional.batch_norm(x, mean, var, training=True, momentum=0.1)


def test_inputs_mutated_in_place_are_updated_like_eager():
    torch.manual_seed(0)
    x, mean, var, counter = torch.randn(4, 3), torch.zeros(3), torch.ones(3), torch.zeros(2, dtype=torch.int64)
    eager_inputs = [t.clone() for t in (x, mean, var, counter)]
    expected = UpdatesRunningStats()(*eager_inputs)
    artifact = export_to_stablehlo(UpdatesRunningStats(), tuple(t.clone() for t in (x, mean, var, counter)))
    assert {s.target for s in artifact.signature.outputs if s.kind == "user_input_mutation"} == \
        {"mean", "var", "counter"}
    ours = [t.clone() for t in (x, mean, var, counter)]
    torch.testing.assert_close(artifact(*ours), expected)
    torch.testing.assert_close(ours, eager_inputs)  # the running stats and the counter, updated in place
    artifact(*ours)
    UpdatesRunningStats()(*eager_inputs)
    torch.testing.assert_close(ours, eager_inputs)


class ScalarAndConstant(torch.nn.Module):
    """Returns a tensor, a Python float from .item(), an int from .item(), a bool and an int constant."""

    def forward(self, x):
        return x * 2, x.sum().item(), x.argmax().item(), (x.max() > 0).item(), 7


def test_item_and_constant_outputs_are_python_values(tmp_path):
    x = torch.randn(5)
    expected = ScalarAndConstant()(x)
    artifact = export_to_stablehlo(ScalarAndConstant(), (x,))
    for actual in (artifact(x), load_artifact(artifact.save(tmp_path / "scalars"))(x)):
        assert [type(v) for v in actual[1:]] == [float, int, bool, int]
        torch.testing.assert_close(actual[0], expected[0])
        assert actual[1] == pytest.approx(expected[1], rel=1e-6) and actual[2:] == expected[2:]


class NamedOutputs(torch.nn.Module):
    def forward(self, x):
        return {"logits": x * 2, "pair": (x.sum(), x.amax())}


def test_outputs_are_named_after_dict_keys_model_output_fields_and_positions(tmp_path):
    """The names a serving user calls outputs by: dict keys and ModelOutput fields joined by dots, positions
    in a returned tuple (or a lone tensor) as output_N, namedtuple fields by name; the same in the signature
    and the manifest."""
    x = torch.randn(2, 3)
    artifact = export_to_stablehlo(NamedOutputs(), (x,))
    assert [slot.tensor.name for slot in artifact.signature.user_outputs] == ["logits", "pair.0", "pair.1"]
    manifest = json.loads((artifact.save(tmp_path / "named") / "manifest.json").read_text())
    assert [slot["tensor"]["name"] for slot in manifest["signature"]["outputs"]] == ["logits", "pair.0", "pair.1"]
    config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16, use_cache=False)
    gpt2 = export_to_stablehlo(GPT2LMHeadModel(config).eval(), (torch.randint(0, 50, (1, 4)),))
    assert [slot.tensor.name for slot in gpt2.signature.user_outputs] == ["logits"]
    pair = export_to_stablehlo(MaxAndPair(), (x,))
    assert [slot.tensor.name for slot in pair.signature.user_outputs] == [
        "output_0.0", "output_0.1", "output_1.low", "output_1.high"]  # namedtuple fields by name
    lone = export_to_stablehlo(torch.nn.ReLU(), (x,))
    assert [slot.tensor.name for slot in lone.signature.user_outputs] == ["output_0"]
