"""Conversion: the pipeline (``export_to_stablehlo`` and ``find_divergence`` both run it), the one FX-graph walk,
in-place functionalisation, weight stacks, the signature (the one owner of ``@main``'s calling convention),
symbolic dims, sharding and source locations."""
