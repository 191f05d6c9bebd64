"""The shared layer under the rule families: emitters that more than one family builds on (slices, gathers and
scatters, contractions, sorts, scans, NaN-aware extremes, random bits, padded data-dependent results, JAX
functions). Modules here register no rules; they import the base modules and each other, never a family.
"""
