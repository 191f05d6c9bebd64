"""Artifact formats: the in-memory artifact, bundles (portable StableHLO, safetensors weights, manifest), stored
weights, atomic folders, StableHLO versions, TF SavedModel, XLA modules, the JAX handoff and IREE."""
