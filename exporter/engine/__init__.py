"""A causal LM as a continuous-batching engine: ``export_engine`` traces the torch steps (``steps``) over one
typed decode state (``state``); the artifact and its runner are ``formats.engine_artifact``'s. Nothing is imported
here: ``formats.engine_artifact`` reads ``state`` without needing transformers."""
