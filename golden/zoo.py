"""The golden model zoo: small, seeded models whose eager outputs are stored in ``golden/data``.

Each entry builds its model from a config with random weights (``torch.manual_seed(SEED)``
just before construction, then ``.eval()``) and its example inputs (from a separate
generator seeded with ``SEED``), so weights never need to be stored: rebuilding an
entry gives the same weights as long as torch's RNG and the model's init code do not
change (the eager test in ``tests/golden/test_zoo.py`` checks that).

Nothing here is downloaded: every transformers model is built from a config.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from torch_stablehlo.exporter.tolerances import F32_TOLERANCE  # f32 models: max |error| / max |golden output|

SEED = 0


@dataclass
class Built:
    """A model ready to run (eval mode) and the inputs it is called with: ``model(*args, **kwargs)``.

    ``abs_tolerance``, set by quantized entries, is the largest absolute error allowed (one output
    quantization step); it replaces the entry's relative ``tolerance``.
    """
    model: nn.Module
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    abs_tolerance: float | None = None


@dataclass(frozen=True)
class ZooEntry:
    name: str
    factory: Callable[..., Built]
    tolerance: float = F32_TOLERANCE      # max abs error / max |golden|, per output
    tags: tuple[str, ...] = ()
    description: str = ""

    def build(self, **size) -> Built:
        """The golden model and inputs; ``size`` (e.g. ``batch=8, length=128`` for text models, ``batch=8,
        image_size=224`` for vision ones) builds other input sizes, as ``bench/run_speed.py`` does. Goldens are
        stored for the default size only."""
        return self.factory(**size)

    @property
    def dynamic(self) -> "DynamicVariant | None":
        """The entry's dynamic-shape variant (``DYNAMIC`` below), if it has one."""
        return DYNAMIC.get(self.name)


ZOO: dict[str, ZooEntry] = {}


def register(name: str, *, tolerance: float = F32_TOLERANCE, tags: tuple[str, ...] = (), description: str = ""):
    def decorate(factory: Callable[[], Built]) -> Callable[[], Built]:
        if name in ZOO:
            raise ValueError(f"zoo entry {name!r} registered twice")
        ZOO[name] = ZooEntry(name, factory, tolerance, tuple(tags), description)
        return factory

    return decorate


def get(name: str) -> ZooEntry:
    try:
        return ZOO[name]
    except KeyError:
        raise KeyError(f"no zoo model named {name!r}; known: {', '.join(ZOO)}") from None


def names(tag: str | None = None) -> list[str]:
    return [name for name, entry in ZOO.items() if tag is None or tag in entry.tags]


# -- helpers ------------------------------------------------------------------------

def example_generator() -> torch.Generator:
    """Inputs come from their own generator, so they do not depend on how much RNG the model used."""
    return torch.Generator().manual_seed(SEED)


def fresh_export(model: nn.Module, args: tuple, kwargs: dict, dynamic_shapes=None) -> torch.export.ExportedProgram:
    """``torch.export.export``, after clearing dynamo's caches: an earlier export of a model with torch's
    ``scan`` leaves guards that break (IndexError) or over-specialise the next one (torch 2.13)."""
    torch._dynamo.reset()
    return torch.export.export(model, tuple(args), dict(kwargs), dynamic_shapes=dynamic_shapes)


def seeded_model(build_model: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(SEED)
    with torch.no_grad():
        model = build_model()
    return model.eval()


def _tokens(vocab_size: int, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch, length), generator=generator, dtype=torch.long)


def _padding_mask(batch: int, length: int, pad: int) -> torch.Tensor:
    """1 for real tokens, 0 for ``pad`` trailing padding positions in the last row (if batch > 1)."""
    mask = torch.ones(batch, length, dtype=torch.long)
    if pad:
        mask[-1, length - pad:] = 0
    return mask


# -- plain torch models ----------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self, d_in: int = 16, hidden: int = 64, d_out: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act1 = nn.GELU()
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.act2 = nn.ReLU()
        self.head = nn.Linear(hidden, d_out)

    def forward(self, x):
        h = self.norm(self.act1(self.fc1(x)))
        h = h + self.act2(self.fc2(h))  # residual
        return self.head(h)


@register("mlp", tags=("torch", "small"), description="Linear/GELU/LayerNorm/ReLU MLP with a residual connection")
def _mlp(batch: int = 4) -> Built:
    model = seeded_model(MLP)
    x = torch.randn(batch, 16, generator=example_generator())
    return Built(model, (x,))


class CNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, kernel_size=3, stride=1, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(32, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def randomize_batchnorm(model: nn.Module) -> None:
    """Non-trivial running statistics and affine parameters, so eval-mode BatchNorm is exercised."""
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.normal_(0.0, 0.1)
            module.running_var.uniform_(0.5, 1.5)
            module.weight.uniform_(0.5, 1.5)
            module.bias.normal_(0.0, 0.1)


@register("cnn", tags=("torch", "small", "conv"),
          description="Conv2d/BatchNorm2d(eval)/ReLU/MaxPool2d/AdaptiveAvgPool2d/Linear")
def _cnn(batch: int = 2, image_size: int = 32) -> Built:
    def build():
        model = CNN()
        randomize_batchnorm(model)
        return model

    model = seeded_model(build)
    x = torch.randn(batch, 3, image_size, image_size, generator=example_generator())
    return Built(model, (x,))


# -- transformers models (built from configs, random weights) -----------------------------

def _gpt2(n_layer: int | None, batch: int = 1, length: int = 8, **config_options) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    options = dict(use_cache=False, **config_options)
    if n_layer is not None:
        options["n_layer"] = n_layer
    config = GPT2Config(**options)
    model = seeded_model(lambda: GPT2LMHeadModel(config))
    generator = example_generator()
    input_ids = _tokens(config.vocab_size, batch, length, generator)
    attention_mask = torch.ones_like(input_ids)
    return Built(model, (), {"input_ids": input_ids, "attention_mask": attention_mask})


@register("gpt2_2layer", tags=("transformers", "small", "attention", "sdpa", "kwargs"),
          description="GPT2LMHeadModel, 2 layers, sdpa attention, kwargs inputs")
def _gpt2_2layer(**size) -> Built:
    return _gpt2(2, **size)


@register("gpt2_2layer_eager", tags=("transformers", "small", "attention", "eager_attention", "kwargs"),
          description="GPT2LMHeadModel, 2 layers, eager (matmul/softmax) attention")
def _gpt2_2layer_eager(**size) -> Built:
    return _gpt2(2, attn_implementation="eager", **size)


@register("gpt2_12layer", tags=("transformers", "large", "slow", "attention", "sdpa", "kwargs", "demo"),
          description="GPT2LMHeadModel with GPT2Config() defaults (12 layers, 768 wide)")
def _gpt2_12layer(**size) -> Built:
    return _gpt2(None, **size)


@register("llama", tags=("transformers", "small", "attention", "sdpa", "gqa", "rope", "rmsnorm"),
          description="LlamaForCausalLM: RMSNorm, RoPE, SwiGLU, GQA (4 heads / 2 kv heads)")
def _llama(batch: int = 1, length: int = 8) -> Built:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         use_cache=False)
    model = seeded_model(lambda: LlamaForCausalLM(config))
    generator = example_generator()
    input_ids = _tokens(config.vocab_size, batch, length, generator)
    return Built(model, (), {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)})


@register("bert", tags=("transformers", "small", "attention", "sdpa", "padding_mask"),
          description="BertModel with input_ids, a padding attention_mask and token_type_ids")
def _bert(batch: int = 2, length: int = 8) -> Built:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=128)
    model = seeded_model(lambda: BertModel(config))
    generator = example_generator()
    input_ids = _tokens(config.vocab_size, batch, length, generator)
    token_type_ids = torch.zeros(batch, length, dtype=torch.long)
    token_type_ids[:, length // 2:] = 1  # two segments
    attention_mask = _padding_mask(batch, length, pad=3)
    return Built(model, (), {"input_ids": input_ids, "attention_mask": attention_mask,
                             "token_type_ids": token_type_ids})


@register("vit", tags=("transformers", "small", "attention", "sdpa", "conv"),
          description="ViTModel: 32x32 images, 8x8 patches")
def _vit(batch: int = 2, image_size: int = 32) -> Built:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(image_size=image_size, patch_size=8, num_channels=3, hidden_size=128, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=256)
    model = seeded_model(lambda: ViTModel(config))
    pixel_values = torch.randn(batch, 3, image_size, image_size, generator=example_generator())
    return Built(model, (pixel_values,))  # positional: the args path for a transformers model



# -- dynamic variants: one export with symbolic dims, checked at several sizes (python -m torch_stablehlo.golden.dynamic) ----------

@dataclass(frozen=True)
class DynamicVariant:
    """``ranges`` maps factory size parameters made symbolic to (min, max); ``dims`` maps each input (a kwarg
    name or an arg position) to {tensor dim: size parameter}. The model is exported once, at ``example`` (a
    size-1 example dim would be specialised by torch.export, so every example size is >= 2; a range may
    still start at 1), then run at every size in ``sizes``, which hold each range's min and max."""
    ranges: dict[str, tuple[int, int]]
    dims: dict[str | int, dict[int, str]]
    sizes: tuple[dict[str, int], ...]
    example: dict[str, int]

    DIM_NAMES = {"batch": "batch", "length": "seq"}

    def dynamic_shapes(self, built: Built):
        """torch.export's ``dynamic_shapes`` for ``built``'s inputs, with fresh ``Dim`` objects."""
        named = {param: torch.export.Dim(self.DIM_NAMES.get(param, param), min=low, max=high)
                 for param, (low, high) in self.ranges.items()}
        specs = {key: {dim: named[param] for dim, param in dims.items()} for key, dims in self.dims.items()}
        if built.kwargs:
            return {key: specs.get(key) for key in built.kwargs}
        return tuple(specs.get(i) for i in range(len(built.args)))


def batch_variant(high: int, inputs: int = 1) -> DynamicVariant:
    """Dim 0 of the first ``inputs`` positional inputs is the batch, 1..``high``."""
    return DynamicVariant({"batch": (1, high)}, {i: {0: "batch"} for i in range(inputs)},
                          ({"batch": 1}, {"batch": 3}, {"batch": high}), {"batch": 2})


def _text_variant(inputs: tuple[str, ...], max_length: int) -> DynamicVariant:
    """Batch 1..8 and sequence 2..``max_length``; sequences start at 2: a length-1 example is specialised by
    torch.export, and one token is not a sequence worth a dynamic dim."""
    return DynamicVariant({"batch": (1, 8), "length": (2, max_length)},
                          {name: {0: "batch", 1: "length"} for name in inputs},
                          ({"batch": 1, "length": 2}, {"batch": 3, "length": 17}, {"batch": 8, "length": 8},
                           {"batch": 2, "length": max_length}), {"batch": 2, "length": 8})


_GPT2_INPUTS = ("input_ids", "attention_mask")
# GPT-2 allows 1024 positions: 128 keeps the largest call's logits (50257 wide) small; llama and bert go to
# their configs' max_position_embeddings
DYNAMIC: dict[str, DynamicVariant] = {
    "mlp": batch_variant(64),
    "cnn": batch_variant(16),
    "vit": batch_variant(8),
    "gpt2_2layer": _text_variant(_GPT2_INPUTS, 128),
    "gpt2_2layer_eager": _text_variant(_GPT2_INPUTS, 128),
    "gpt2_12layer": _text_variant(_GPT2_INPUTS, 128),
    "llama": _text_variant(_GPT2_INPUTS, 256),
    "bert": _text_variant(("input_ids", "attention_mask", "token_type_ids"), 128),
}
