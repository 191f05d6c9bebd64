"""Sharding plans found for the user: the search over the exported graph (``op_dims`` -> ``problem`` -> ``solve``,
an integer linear program priced with costs measured on the mesh's devices), FSDP plans, and their picture."""
