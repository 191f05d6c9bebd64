"""A transformers causal LM's generate loop as one StableHLO program (``export_generate``): the steps it is made of
(``steps``), the settings it honours (``settings``), the module that loops over them (``compose``)."""
from .api import GenerateArtifact, export_generate

__all__ = ["export_generate", "GenerateArtifact"]
