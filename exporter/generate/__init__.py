"""A transformers model's generate loop as one StableHLO program (``export_generate``): the steps it is made of
(``steps`` for causal LMs, ``seq2seq_steps`` for encoder-decoders), the settings it honours (``settings``), the
module that loops over them (``compose``), the artifact it is (``program``)."""
from .api import export_generate
from .program import GenerateArtifact
from .seq2seq import Seq2SeqGenerateArtifact

__all__ = ["export_generate", "GenerateArtifact", "Seq2SeqGenerateArtifact"]
