"""StableHLO plumbing that conversion needs: MLIR contexts, tensor specs, torch <-> numpy dtypes, pass
pipelines, shape refinement and module rewrites. ``exporter`` converts with it and ``runtime`` refines and
legalizes with it before compiling; it imports neither.
"""
