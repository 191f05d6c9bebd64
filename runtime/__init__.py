"""PJRT runtime: the client (CPU by default), the in-memory and on-disk compile cache."""
