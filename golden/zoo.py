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

SEED = 0

# f32 models: the largest absolute error over an output must be at most
# F32_TOLERANCE * max(|golden output|), i.e. the tolerance is relative to the output's scale.
F32_TOLERANCE = 1e-4


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
    factory: Callable[[], Built]
    tolerance: float = F32_TOLERANCE      # max abs error / max |golden|, per output
    tags: tuple[str, ...] = ()
    description: str = ""

    def build(self) -> Built:
        return self.factory()


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

def _generator() -> torch.Generator:
    """Inputs come from their own generator, so they do not depend on how much RNG the model used."""
    return torch.Generator().manual_seed(SEED)


def _seeded(build_model: Callable[[], nn.Module]) -> nn.Module:
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
def _mlp() -> Built:
    model = _seeded(MLP)
    x = torch.randn(4, 16, generator=_generator())
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


def _randomize_batchnorm(model: nn.Module) -> None:
    """Non-trivial running statistics and affine parameters, so eval-mode BatchNorm is exercised."""
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.normal_(0.0, 0.1)
            module.running_var.uniform_(0.5, 1.5)
            module.weight.uniform_(0.5, 1.5)
            module.bias.normal_(0.0, 0.1)


@register("cnn", tags=("torch", "small", "conv"),
          description="Conv2d/BatchNorm2d(eval)/ReLU/MaxPool2d/AdaptiveAvgPool2d/Linear")
def _cnn() -> Built:
    def build():
        model = CNN()
        _randomize_batchnorm(model)
        return model

    model = _seeded(build)
    x = torch.randn(2, 3, 32, 32, generator=_generator())
    return Built(model, (x,))


# -- transformers models (built from configs, random weights) -----------------------------

def _gpt2(n_layer: int | None, **config_options) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    options = dict(use_cache=False, **config_options)
    if n_layer is not None:
        options["n_layer"] = n_layer
    config = GPT2Config(**options)
    model = _seeded(lambda: GPT2LMHeadModel(config))
    generator = _generator()
    input_ids = _tokens(config.vocab_size, 1, 8, generator)
    attention_mask = torch.ones_like(input_ids)
    return Built(model, (), {"input_ids": input_ids, "attention_mask": attention_mask})


@register("gpt2_2layer", tags=("transformers", "small", "attention", "sdpa", "kwargs"),
          description="GPT2LMHeadModel, 2 layers, sdpa attention, kwargs inputs")
def _gpt2_2layer() -> Built:
    return _gpt2(2)


@register("gpt2_2layer_eager", tags=("transformers", "small", "attention", "eager_attention", "kwargs"),
          description="GPT2LMHeadModel, 2 layers, eager (matmul/softmax) attention")
def _gpt2_2layer_eager() -> Built:
    return _gpt2(2, attn_implementation="eager")


@register("gpt2_12layer", tags=("transformers", "large", "slow", "attention", "sdpa", "kwargs", "demo"),
          description="GPT2LMHeadModel with GPT2Config() defaults (12 layers, 768 wide)")
def _gpt2_12layer() -> Built:
    return _gpt2(None)


@register("llama", tags=("transformers", "small", "attention", "sdpa", "gqa", "rope", "rmsnorm"),
          description="LlamaForCausalLM: RMSNorm, RoPE, SwiGLU, GQA (4 heads / 2 kv heads)")
def _llama() -> Built:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         use_cache=False)
    model = _seeded(lambda: LlamaForCausalLM(config))
    generator = _generator()
    input_ids = _tokens(config.vocab_size, 1, 8, generator)
    return Built(model, (), {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)})


@register("bert", tags=("transformers", "small", "attention", "sdpa", "padding_mask"),
          description="BertModel with input_ids, a padding attention_mask and token_type_ids")
def _bert() -> Built:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=256, max_position_embeddings=128)
    model = _seeded(lambda: BertModel(config))
    generator = _generator()
    batch, length = 2, 8
    input_ids = _tokens(config.vocab_size, batch, length, generator)
    token_type_ids = torch.zeros(batch, length, dtype=torch.long)
    token_type_ids[:, length // 2:] = 1  # two segments
    attention_mask = _padding_mask(batch, length, pad=3)
    return Built(model, (), {"input_ids": input_ids, "attention_mask": attention_mask,
                             "token_type_ids": token_type_ids})


@register("vit", tags=("transformers", "small", "attention", "sdpa", "conv"),
          description="ViTModel: 32x32 images, 8x8 patches")
def _vit() -> Built:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=128, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=256)
    model = _seeded(lambda: ViTModel(config))
    pixel_values = torch.randn(2, 3, 32, 32, generator=_generator())
    return Built(model, (pixel_values,))  # positional: the args path for a transformers model


from . import quantized  # noqa: E402,F401  (registers the quantized entries)
