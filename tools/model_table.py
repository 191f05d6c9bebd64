"""The model sweep's table: transformers architectures built from tiny configs (random weights, seeded; nothing
downloaded), each with the kind of inputs it takes. ``tools.model_sweep`` (``make models``) reads every entry and
``tests/tools/test_model_sweep.py`` a fixed sample.

An input kind names the inputs a model takes, their sizes for the static export, the symbolic dims of the dynamic
export (``Dim`` name -> the inputs' dims it sizes) and the other sizes the dynamic program is run at.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import transformers
from torch import nn
from torch.export import Dim

SEED = 0
VOCAB = 100
IMAGE = (3, 32, 32)
MEL_BINS, FRAMES = 16, 32   # Whisper's encoder takes 2 x max_source_positions frames

DIMS = {"batch": Dim("batch", max=8), "sequence": Dim("sequence", max=32), "target": Dim("target", max=16),
        "samples": Dim("samples", min=400, max=1600)}
STATIC_SIZES = {"batch": 2, "sequence": 7, "target": 5, "samples": 400}
DYNAMIC_SIZES = {"batch": 3, "sequence": 5, "target": 6, "samples": 560}


@dataclass(frozen=True)
class InputKind:
    """``inputs``: input name -> its shape, each dim a size name (``batch``, ...) or an int; ``dynamic``: the size
    names exported as symbolic dims; ``integer``: the inputs drawn as token ids (the others: float32 normals)."""
    inputs: dict[str, tuple]
    dynamic: tuple[str, ...]
    integer: tuple[str, ...] = ()    # inputs that are token ids

    def build(self, sizes: dict[str, int], generator: torch.Generator) -> dict[str, torch.Tensor]:
        built = {}
        for name, dims in self.inputs.items():
            shape = tuple(sizes[d] if isinstance(d, str) else d for d in dims)
            built[name] = (torch.randint(3, VOCAB, shape, generator=generator) if name in self.integer
                           else torch.randn(shape, generator=generator))
        return built

    def dynamic_shapes(self) -> dict[str, dict[int, Dim]]:
        return {name: {i: DIMS[d] for i, d in enumerate(dims) if d in self.dynamic}
                for name, dims in self.inputs.items()}


TEXT = InputKind({"input_ids": ("batch", "sequence")}, ("batch", "sequence"), integer=("input_ids",))
SEQ2SEQ = InputKind({"input_ids": ("batch", "sequence"), "decoder_input_ids": ("batch", "target")},
                    ("batch", "sequence", "target"), integer=("input_ids", "decoder_input_ids"))
IMAGES = InputKind({"pixel_values": ("batch", *IMAGE)}, ("batch",))
AUDIO = InputKind({"input_values": ("batch", "samples")}, ("batch", "samples"))
SPEECH_TO_TEXT = InputKind({"input_features": ("batch", MEL_BINS, FRAMES), "decoder_input_ids": ("batch", "target")},
                           ("batch", "target"), integer=("decoder_input_ids",))
TEXT_AND_IMAGES = InputKind({"input_ids": ("batch", "sequence"), "pixel_values": ("batch", *IMAGE)},
                            ("batch", "sequence"), integer=("input_ids",))


@dataclass(frozen=True)
class ModelEntry:
    name: str
    category: str
    model_class: str             # a transformers class name; its config class is its ``config_class``
    config: dict
    kind: InputKind
    dynamic: tuple[str, ...] | None = None   # the size names made symbolic, when fewer than the kind's
    notes: str = ""    # why the dynamic pass makes fewer dims symbolic than the kind (torch.export's limit)

    def build(self) -> nn.Module:
        model_class = getattr(transformers, self.model_class)
        torch.manual_seed(SEED)
        return model_class(model_class.config_class(**self.config)).eval()

    def inputs(self, dynamic: bool = False) -> dict[str, torch.Tensor]:
        """The example inputs (``dynamic``: the other sizes the dynamic program is checked at)."""
        sizes = {**STATIC_SIZES, **(self._dynamic_sizes() if dynamic else {})}
        return self.kind.build(sizes, torch.Generator().manual_seed(SEED + dynamic))

    def dynamic_shapes(self) -> dict[str, dict[int, Dim]]:
        return {name: {i: dim for i, dim in dims.items() if dim.__name__ in self.symbolic}
                for name, dims in self.kind.dynamic_shapes().items()}

    @property
    def symbolic(self) -> tuple[str, ...]:
        return self.kind.dynamic if self.dynamic is None else self.dynamic

    def _dynamic_sizes(self) -> dict[str, int]:
        return {name: DYNAMIC_SIZES[name] for name in self.symbolic}


LAYERS = dict(num_hidden_layers=2, num_attention_heads=4)
DECODER = dict(hidden_size=32, intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64, use_cache=False,
               **LAYERS)
ENCODER = dict(hidden_size=32, intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64, **LAYERS)
SEQ2SEQ_SHAPES = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB,
                      max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                      decoder_start_token_id=2, use_cache=False)
VIT = dict(hidden_size=32, intermediate_size=64, image_size=32, patch_size=8, **LAYERS)
SPEECH = dict(hidden_size=32, intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
              num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, vocab_size=VOCAB, **LAYERS)
MOE = dict(DECODER, num_key_value_heads=2, num_experts_per_tok=2)
TOWER = dict(hidden_size=32, intermediate_size=64, **LAYERS)


def _entries(category: str, kind: InputKind, rows: list[tuple]) -> list[ModelEntry]:
    return [ModelEntry(name, category, model_class, config, kind, *rest) for name, model_class, config, *rest in rows]


MODELS: dict[str, ModelEntry] = {entry.name: entry for entry in [
    *_entries("decoder", TEXT, [
        ("gpt2", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2,
                                         use_cache=False)),
        ("llama", "LlamaForCausalLM", dict(DECODER, num_key_value_heads=2)),
        ("mistral", "MistralForCausalLM", dict(DECODER, num_key_value_heads=2, sliding_window=4)),
        ("qwen2", "Qwen2ForCausalLM", dict(DECODER, num_key_value_heads=2)),
        ("gemma2", "Gemma2ForCausalLM", dict(DECODER, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
                                             sliding_window=4)),
        ("phi3", "Phi3ForCausalLM", dict(DECODER, num_key_value_heads=2, pad_token_id=0, eos_token_id=2)),
        ("gpt_neox", "GPTNeoXForCausalLM", DECODER),
        ("falcon", "FalconForCausalLM", dict(DECODER, multi_query=True, bos_token_id=1, eos_token_id=2)),
        ("bloom", "BloomForCausalLM", dict(hidden_size=32, n_layer=2, n_head=4, vocab_size=VOCAB, use_cache=False)),
        ("opt", "OPTForCausalLM", dict(DECODER, ffn_dim=64, word_embed_proj_dim=32)),
    ]),
    *_entries("encoder", TEXT, [
        ("bert", "BertModel", ENCODER),
        ("roberta", "RobertaModel", dict(ENCODER, pad_token_id=1)),
        ("albert", "AlbertModel", dict(ENCODER, embedding_size=16)),
        ("distilbert", "DistilBertModel", dict(dim=32, hidden_dim=64, n_layers=2, n_heads=4, vocab_size=VOCAB,
                                               max_position_embeddings=64)),
        ("electra", "ElectraModel", dict(ENCODER, embedding_size=16)),
        ("deberta_v2", "DebertaV2Model", dict(ENCODER, relative_attention=True, position_buckets=8,
                                              pos_att_type=["p2c", "c2p"])),
        ("modernbert", "ModernBertModel", dict(ENCODER, local_attention=4, pad_token_id=0, bos_token_id=1,
                                               eos_token_id=2, cls_token_id=1, sep_token_id=2)),
    ]),
    *_entries("encoder-decoder", SEQ2SEQ, [
        ("t5", "T5ForConditionalGeneration", dict(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_decoder_layers=2,
                                                  num_heads=4, vocab_size=VOCAB, decoder_start_token_id=0,
                                                  use_cache=False)),
        ("bart", "BartForConditionalGeneration", SEQ2SEQ_SHAPES),
        ("marian", "MarianMTModel", dict(SEQ2SEQ_SHAPES, decoder_vocab_size=VOCAB, decoder_start_token_id=1)),
        ("pegasus", "PegasusForConditionalGeneration", SEQ2SEQ_SHAPES),
        ("m2m_100", "M2M100ForConditionalGeneration", SEQ2SEQ_SHAPES),
    ]),
    *_entries("vision", IMAGES, [
        ("vit", "ViTModel", VIT),
        ("deit", "DeiTModel", VIT),
        ("dinov2", "Dinov2Model", VIT),
        ("convnext", "ConvNextModel", dict(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])),
        ("resnet", "ResNetModel", dict(embedding_size=8, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])),
        ("swin", "SwinModel", dict(image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[2, 2],
                                   window_size=4)),
        ("segformer", "SegformerForSemanticSegmentation",
         dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3],
              strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=16, num_labels=3)),
        ("mobilenet_v2", "MobileNetV2Model", dict(image_size=32, depth_multiplier=0.35)),
    ]),
    *_entries("audio", AUDIO, [
        ("wav2vec2", "Wav2Vec2Model", SPEECH),
        ("hubert", "HubertModel", SPEECH),
        ("wavlm", "WavLMModel", dict(SPEECH, num_buckets=16, max_bucket_distance=32)),
    ]),
    *_entries("audio", SPEECH_TO_TEXT, [
        ("whisper", "WhisperForConditionalGeneration",
         dict(SEQ2SEQ_SHAPES, num_mel_bins=MEL_BINS, max_source_positions=FRAMES // 2, max_target_positions=32,
              decoder_start_token_id=1, suppress_tokens=None, begin_suppress_tokens=None)),
    ]),
    *_entries("moe", TEXT, [
        ("mixtral", "MixtralForCausalLM", dict(MOE, num_local_experts=4)),
        ("qwen2_moe", "Qwen2MoeForCausalLM", dict(MOE, num_experts=4, moe_intermediate_size=32,
                                                  shared_expert_intermediate_size=48)),
        ("olmoe", "OlmoeForCausalLM", dict(MOE, num_experts=4, eos_token_id=2)),
    ]),
    *_entries("state-space", TEXT, [
        ("mamba", "MambaForCausalLM", dict(hidden_size=32, num_hidden_layers=2, vocab_size=VOCAB, state_size=8,
                                           use_cache=False), ("batch",),
         "torch.export specialises the sequence (the reference scan loops over it): `Constraints violated "
         "(sequence)! ... your code specialized it to be a constant (7)`"),
        ("mamba2", "Mamba2ForCausalLM", dict(hidden_size=32, num_hidden_layers=2, vocab_size=VOCAB, state_size=8,
                                             head_dim=16, num_heads=4, n_groups=1, chunk_size=4, use_cache=False),
         ("batch",), "torch.export guards the sequence to whole chunks: `Constraints violated (sequence)! Not all "
                     "values of sequence ... satisfy the generated guard`"),
    ]),
    *_entries("multimodal", TEXT_AND_IMAGES, [
        ("clip", "CLIPModel", dict(text_config=dict(TOWER, vocab_size=VOCAB, max_position_embeddings=64),
                                   vision_config=dict(TOWER, image_size=32, patch_size=8), projection_dim=16)),
        ("siglip", "SiglipModel", dict(text_config=dict(TOWER, vocab_size=VOCAB, max_position_embeddings=64),
                                       vision_config=dict(TOWER, image_size=32, patch_size=8))),
    ]),
]}

MINIMUM_PER_CATEGORY = {"decoder": 8, "encoder": 6, "encoder-decoder": 4, "vision": 6, "audio": 3, "moe": 3,
                        "state-space": 2, "multimodal": 2}
"""What the sweep must cover (issue 23); ``tests/tools/test_model_sweep.py`` checks the table against it."""
