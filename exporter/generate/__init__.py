"""A transformers model's generate loop as one StableHLO program (``export_generate``): the steps it is made of
(``loop_steps`` for causal LMs, ``seq2seq_steps`` for encoder-decoders), the settings it honours
(``generation_settings``), the module that loops over them (``compose``), the artifact it is
(``generate_artifact``); ``causal_lm`` and ``seq2seq`` export them."""
from .causal_lm import export_generate
from .generate_artifact import GenerateArtifact
from .seq2seq import Seq2SeqGenerateArtifact

__all__ = ["export_generate", "GenerateArtifact", "Seq2SeqGenerateArtifact"]
